"""Window models' pages and window snapshots below the pool (host and disk tiers), through the engine.

A window model resumes a prefix only where a window snapshot ends it, so a tier that brought pages
back without their snapshot would serve nothing (before this, the engine refused the tiers for window
models: ``--kv-store`` raised EngineError).  Each test compares with an engine whose pool never
evicts (the cached tokens a window model should get) and with the naive engine (the outputs).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conversation_trees import check_conversation_tree, tree_atol
from tests.engine_drive import greedy, random_ids, run_checked, tiny_engine
from tests.helpers import make_tiny_windowed

PS = 4


@pytest.fixture(scope="module", params=["gemma3-odd", "gemma4-odd"])
def model(request, tmp_path_factory):
    return make_tiny_windowed(tmp_path_factory.mktemp("wt") / request.param, request.param)


@pytest.fixture(scope="module")
def off(model):
    return tiny_engine(model, page_size=PS, prefix_cache="off", num_pages=1024, record_logits=True)


def _roomy(model, *turns):
    """The last turn's cached tokens on an engine whose pool holds everything: what no eviction takes away."""
    eng = tiny_engine(model, page_size=PS, num_pages=1024)
    return [_run(eng, t) for t in turns][-1].cached_tokens


@pytest.fixture(scope="module")
def atol(model):
    return tree_atol(model)


@pytest.fixture(scope="module")
def snap_bytes(model):
    return tiny_engine(model, page_size=PS).runner.state_pool.snapshot_bytes


def _run(eng, prompt, n=3):
    r = eng.make_request(list(prompt), greedy(n))
    run_checked(eng, [r])
    return r


def _turns(gen):
    """Two unrelated 70-token conversations (the second evicts the first from a 24-page pool) and the
    first's next turn: its prompt, its output, new tokens."""
    return random_ids(gen, 70), random_ids(gen, 70), random_ids(gen, 6)


@pytest.mark.parametrize("host", [None, "2M"])
def test_evicted_window_session_comes_back_with_its_snapshot(model, off, tmp_path, host):
    gen = torch.Generator().manual_seed(1)
    a, b, more = _turns(gen)
    store = {"kv_store": str(tmp_path)} if host is None else {"kv_host_memory": host}
    eng = tiny_engine(model, page_size=PS, num_pages=24, **store)
    ra = _run(eng, a)
    assert _run(eng, b).cached_tokens == 0  # a's pages (and its snapshots) go down to the tier
    assert eng.cache.prefix.state_tier.stored + int(host is None) > 0
    nxt = list(ra.tokens) + more
    r = _run(eng, nxt)
    assert r.cached_tokens == _roomy(model, a, nxt) > 0  # as if nothing had been evicted
    below = r.cached_disk_tokens if host is None else r.cached_host_tokens
    assert below > 0 and r.cached_host_tokens + r.cached_disk_tokens <= r.cached_tokens
    assert r.output_ids == _run(off, nxt).output_ids
    eng.close()


def _restarted(model, store, gen, between=lambda: None):
    """A 50-token turn on an engine over ``store``, closed (persisting it); ``between``; then the
    next turn on a new engine over the same store: (that engine, turn 1, turn 2, turn 2's request)."""
    turn1 = random_ids(gen, 50)
    eng = tiny_engine(model, page_size=PS, num_pages=256, kv_store=str(store))
    r1 = _run(eng, turn1)
    eng.close()  # persists pages and window snapshots
    between()
    eng2 = tiny_engine(model, page_size=PS, num_pages=256, kv_store=str(store))
    turn2 = list(r1.tokens) + random_ids(gen, 9)
    return eng2, turn1, turn2, _run(eng2, turn2)


def test_restart_finds_window_sessions_on_the_store(model, off, tmp_path):
    eng2, turn1, turn2, r2 = _restarted(model, tmp_path, torch.Generator().manual_seed(2))
    assert list((tmp_path / "window_states").glob("*.state"))
    assert r2.cached_tokens == r2.cached_disk_tokens == _roomy(model, turn1, turn2) > 0
    assert r2.output_ids == _run(off, turn2).output_ids
    eng2.close()
    from kvreuse.runtime.cli.cache import main

    assert main(["clear", "--kv-store", str(tmp_path)]) == 0
    assert not list((tmp_path / "window_states").glob("*.state"))


def test_corrupt_snapshot_file_is_recomputed(model, off, tmp_path):
    def corrupt():
        for f in (tmp_path / "window_states").glob("*.state"):
            raw = bytearray(f.read_bytes())
            raw[-1] ^= 0xFF
            f.write_bytes(bytes(raw))

    eng2, _, turn2, r2 = _restarted(model, tmp_path, torch.Generator().manual_seed(3), corrupt)
    assert r2.cached_tokens == 0  # no snapshot passed its checksum: nothing to resume from
    assert eng2.cache.prefix.state_tier.corrupt > 0
    assert r2.output_ids == _run(off, turn2).output_ids
    eng2.close()


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_tiers_match_off_on_random_conversation_trees(model, off, atol, snap_bytes, tmp_path_factory, data):
    """Branching conversations on a 24-page pool and a 3-snapshot budget, so pages and snapshots go down
    and come back (host tier of 16 KiB or none, over a disk store): outputs as the naive engine's,
    integrity after every step (the radix tree's states, the pool, the tiers)."""
    host = data.draw(st.sampled_from([None, "16K"]), label="host_tier")
    eng = tiny_engine(model, page_size=PS, num_pages=24, chunk_size=24, snapshot_every=2,
                      snapshot_memory=3 * snap_bytes, kv_store=str(tmp_path_factory.mktemp("store")),
                      kv_host_memory=host, record_logits=True)  # fmt: skip
    check_conversation_tree(data, eng, off, max_out=6, atol=atol)
    eng.close()


def test_snapshot_files_stay_within_their_share_of_the_store_size(model, off, snap_bytes, tmp_path):
    """``--kv-store-size`` bounds the whole folder: the pages get 3/4, the window snapshot files 1/4
    (before, the snapshot files grew without bound beside a store that counted only its pages)."""
    from kvreuse.runtime.runner.window_pool import WindowPool

    size = 16 * snap_bytes
    eng = tiny_engine(model, page_size=PS, num_pages=24, kv_store=str(tmp_path), kv_store_size=size)
    gen = torch.Generator().manual_seed(4)
    sessions = [random_ids(gen, 70) for _ in range(8)]
    firsts = [_run(eng, s) for s in sessions]  # each evicts the ones before from the 24-page pool
    eng.close()
    files = list((tmp_path / "window_states").glob("*.state"))
    on_disk = sum(f.stat().st_size for f in files)
    assert eng.cache.prefix.state_tier.dropped > 0  # the share was reached, the oldest went
    assert 0 < on_disk <= WindowPool.snapshot_store_share * size
    pages = sum(f.stat().st_size for f in (tmp_path / "groups").glob("*"))
    assert pages + on_disk <= size
    # the newest session still resumes from the store, with the output of an engine without cache
    eng2 = tiny_engine(model, page_size=PS, num_pages=256, kv_store=str(tmp_path), kv_store_size=size)
    nxt = list(firsts[-1].tokens) + random_ids(gen, 5)
    r = _run(eng2, nxt)
    assert r.cached_disk_tokens > 0
    assert r.output_ids == _run(off, nxt).output_ids
    eng2.close()
