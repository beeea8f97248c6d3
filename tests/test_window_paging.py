"""Window layers in per-request rings, window snapshots beside the radix tree (Gemma 3 shape).

* the pool keeps pages only for the full-attention layers; the rings' size does not grow with the
  context, and logits stay transformers' far past the ring's length;
* with-cache == without-cache on random conversation trees, with a small pool (eviction, retraction)
  and a snapshot budget of 3 (snapshot eviction), integrity after every step;
* a 10-turn append-only session reuses all but the new tokens and the distance to the last
  snapshot (page arithmetic, independently of the cache); a prompt extended within the same turn
  (vLLM #57610's case) hits at the first prompt's last page boundary;
* ``window_paging=False`` keeps every layer in pages, with the same outputs.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvreuse.runtime.runner.window_pool import WindowPool
from kvreuse.runtime.sampling.params import SamplingParams
from tests.conversation_trees import check_conversation_tree, tree_atol
from tests.conversation_trees import run_all as _run
from tests.engine_drive import assert_logits_close, random_ids, tiny_engine
from tests.helpers import load_hf, make_tiny_windowed
from tests.parity import all_logits

W = 7  # gemma3-odd's window: layers 0, 1, 3 slide, 2 and 4 attend to everything


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_windowed(tmp_path_factory.mktemp("wp") / "m", "gemma3-odd")


def _engine(d, **kw):
    return tiny_engine(d, **{"page_size": 4, "num_pages": 512, "record_logits": True, **kw})


def test_gemma4_shapes_and_shared_layers_cost_no_kv(tmp_path):
    """gemma4-odd: layers 5 (sliding) and 6 (full) read layers 3's and 4's KV; full layers' pages are
    one 24-wide KV head, sliding layers' rings three 16-wide heads; no window paging is refused."""
    d = make_tiny_windowed(tmp_path / "g4", "gemma4-odd")
    eng = _engine(d)
    r, cfg = eng.runner, eng.runner.cfg
    assert cfg.cache_layers == (0, 1, 2, 3, 4) and cfg.kv_source[5:] == (3, 4)
    assert len(r.pool.layers) == 2 and r.pool.layers[0][0].shape[2:] == (1, 24)
    assert len(r.state_pool.layers) == 3 and r.state_pool.layers[0][0].shape[2:] == (3, 16)
    assert r.kv_layers[5] is r.kv_layers[3] and r.kv_layers[6] is r.kv_layers[4]
    assert r.pool.bytes_per_page == 2 * 2 * 24 * 4 * 4  # 2 owning full layers x k, v x 24 x fp32 x 4 tokens
    with pytest.raises(ValueError, match="KV shapes differ"):
        _engine(d, window_paging=False)


def test_pool_pages_hold_only_full_attention_layers(model_dir):
    eng = _engine(model_dir, chunk_size=16, max_running=2)
    ring = eng.runner.state_pool
    assert isinstance(ring, WindowPool) and len(ring.layers) == 3 and len(eng.runner.pool.layers) == 2
    assert ring.ring_pages == -(-(W + 16) // 4) + 1  # 7 keys of window + a 16-token chunk, +1 page
    twin = _engine(model_dir, window_paging=False)
    assert twin.runner.state_pool.num_slots == 0 and len(twin.runner.pool.layers) == 5
    assert eng.runner.pool.bytes_per_page * 5 == twin.runner.pool.bytes_per_page * 2
    # a 150-token prompt wraps the 6-page ring six times; the logits are still transformers'
    ids = random_ids(torch.Generator().manual_seed(1), 150)
    with torch.no_grad():
        ref = load_hf(model_dir)(torch.tensor([ids])).logits[0].float()
    wide = _engine(model_dir, chunk_size=150)  # all_logits prefills in one chunk
    assert (all_logits(wide, ids) - ref).abs().max().item() < 1e-4
    out = eng.generate([ids], SamplingParams(max_tokens=20, ignore_eos=True))[0].output_token_ids
    assert twin.generate([ids], SamplingParams(max_tokens=20, ignore_eos=True))[0].output_token_ids == out


@pytest.fixture(scope="module")
def engines(model_dir) -> dict:
    snap = _engine(model_dir).runner.state_pool.snapshot_bytes
    out = {"off": _engine(model_dir, prefix_cache="off")}
    for small in (False, True):
        out[small] = _engine(
            model_dir, num_pages=(96 if small else 1024) // 4, chunk_size=24,
            snapshot_memory=3 * snap if small else None, snapshot_every=2,
        )  # fmt: skip
    out["atol"] = tree_atol(model_dir)
    return out


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(data=st.data())
def test_cache_matches_off_on_random_conversation_trees(engines, data):
    small = data.draw(st.booleans(), label="small_pool")
    # a window model: at most one window (W = 7) beyond its divergence's page
    slack = None if small else W
    check_conversation_tree(
        data, engines[small], engines["off"], max_out=6, atol=engines["atol"], slack=slack
    )


def test_ten_turn_session_prefills_only_new_tokens(model_dir):
    """Turn t's prompt is turn t-1's prompt + output + new tokens.  The previous turn computed all but
    its last sampled token, so its last window snapshot is at the page boundary at or below that:
    cached = floor((len(prev) - 1) / ps) * ps, prefilled = new + (len(prev) - cached) <= new + ps."""
    ps = 4
    eng, off = _engine(model_dir, chunk_size=64), _engine(model_dir, chunk_size=64, prefix_cache="off")
    gen = torch.Generator().manual_seed(7)
    prev: list[int] = []
    for turn in range(10):
        new = random_ids(gen, 5 + 7 * turn % 23)
        (req,) = _run(eng, [prev + new], [6])
        (ref,) = _run(off, [prev + new], [6])
        assert req.output_ids == ref.output_ids
        snap = (len(prev) - 1) // ps * ps if prev else 0
        assert (req.cached_tokens, req.prefilled_tokens) == (snap, len(new) + len(prev) - snap), turn
        prev = list(req.tokens)
    eng.cache.check_integrity()
    assert eng.stats().snapshots > 0


@pytest.mark.parametrize("extra", [0, 1, 2, 3])
def test_prompt_whose_last_boundary_is_a_chunk_end_resumes_there(model_dir, extra):
    """Issue 50: a prompt of one chunk + a few tokens (its last page boundary is the first chunk's end)
    and a reply that reaches no further page.  The next turn resumes at that chunk end (16), not at 0."""
    eng, off = _engine(model_dir, chunk_size=16), _engine(model_dir, chunk_size=16, prefix_cache="off")
    gen = torch.Generator().manual_seed(9)
    first = random_ids(gen, 16 + extra)
    (turn1,) = _run(eng, [first], [1])
    nxt = list(turn1.tokens) + random_ids(gen, 6)
    (req,) = _run(eng, [nxt], [4])
    (ref,) = _run(off, [nxt], [4])
    assert req.output_ids == ref.output_ids
    assert (req.cached_tokens, req.prefilled_tokens) == (16, len(nxt) - 16)
    eng.cache.check_integrity()


@pytest.mark.parametrize("cut", [5, 6, 9])
def test_rewrite_before_the_first_snapshot_resumes_at_its_page(tmp_path_factory, cut):
    """Issue 50: a rewrite before the first snapshot recomputed everything (the match was cut back to
    the root).  gemma3-pattern (W = 12, pages of 4): the first prompt's snapshot at 12 holds the window
    keys of positions 0..11, so a prompt that diverges at ``cut`` resumes at ``cut``'s page, its
    output and logits those of a cold engine."""
    d = make_tiny_windowed(tmp_path_factory.mktemp("wp12") / "m", "gemma3-pattern")
    eng, off = _engine(d, chunk_size=64), _engine(d, chunk_size=64, prefix_cache="off")
    gen = torch.Generator().manual_seed(10)
    first = random_ids(gen, 14)
    _run(eng, [first], [1])  # snapshots at 12 (the prompt's end) and none before
    rewrite = first[:cut] + random_ids(gen, 9)
    (req,) = _run(eng, [rewrite], [5])
    (ref,) = _run(off, [rewrite], [5])
    assert req.output_ids == ref.output_ids
    assert_logits_close(req, ref, tree_atol(d))
    page = cut // 4 * 4
    assert (req.cached_tokens, req.prefilled_tokens) == (page, len(rewrite) - page)
    eng.cache.check_integrity()


def test_budget_taken_by_the_rings_says_so(model_dir):
    """Issue 50: Gemma 270M at --kv-cache-memory 1G failed with "one page needs 98304 bytes", not
    saying that 64 running slots' window rings had taken the budget."""
    with pytest.raises(ValueError, match=r"window rings of 64 running requests \(--max-running\)"):
        tiny_engine(model_dir, page_size=4, num_pages=None, kv_cache_memory="4M")
    assert tiny_engine(
        model_dir, page_size=4, num_pages=None, kv_cache_memory="4M", max_running=4
    ).runner.pool


def test_prompt_extended_within_the_turn_hits(model_dir):
    """vLLM #57610: the same turn's prompt grows (a tool result appended before any output is kept)."""
    eng, off = _engine(model_dir, chunk_size=64), _engine(model_dir, chunk_size=64, prefix_cache="off")
    gen = torch.Generator().manual_seed(8)
    first = random_ids(gen, 45)
    _run(eng, [first], [3])
    longer = first + random_ids(gen, 10)
    (req,) = _run(eng, [longer], [5])
    (ref,) = _run(off, [longer], [5])
    assert req.output_ids == ref.output_ids
    assert req.cached_tokens == 44 and req.prefilled_tokens == len(longer) - 44


def test_disk_tier_restart_with_window_paging_off(model_dir, tmp_path):
    """With ``window_paging=False`` every layer's KV is in pages and a restarted engine resumes from
    disk (with rings, the tiers keep window snapshots beside the pages: tests/test_window_tiers.py)."""
    store = str(tmp_path / "store")
    gen = torch.Generator().manual_seed(9)
    turn1 = random_ids(gen, 50)
    eng = _engine(model_dir, window_paging=False, kv_store=store)
    (r1,) = _run(eng, [turn1], [4])
    eng.close()
    eng2 = _engine(model_dir, window_paging=False, kv_store=store)
    turn2 = list(r1.tokens) + random_ids(gen, 9)
    (r2,) = _run(eng2, [turn2], [4])
    assert r2.cached_tokens == r2.cached_disk_tokens == len(r1.tokens) // 4 * 4
    (ref,) = _run(_engine(model_dir, prefix_cache="off"), [turn2], [4])
    assert r2.output_ids == ref.output_ids
    eng2.close()
