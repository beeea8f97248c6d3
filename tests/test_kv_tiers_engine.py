"""The host/disk tiers under the radix tree, through the engine: same outputs, exact tier accounting.

Expected outputs come from the naive engine (``prefix_cache="off"``); every step is followed by the
integrity check, which covers the pool, the host tier and the disk store.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvreuse.runtime.cache.store import StoreError
from kvreuse.runtime.engine.engine import EngineError
from tests.engine_drive import assert_logits_close, greedy, random_ids, run_checked, tiny_engine
from tests.helpers import make_tiny_model

PS = 4


@pytest.fixture(scope="module")
def model(tiny_models):
    return tiny_models[("llama", False)]


@pytest.fixture(scope="module")
def off(model):
    return tiny_engine(model, prefix_cache="off", num_pages=1024, record_logits=True)


def _run(eng, prompt, n=3):
    r = eng.make_request(list(prompt), greedy(n))
    run_checked(eng, [r])
    return r


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_tiers_change_nothing_but_where_pages_come_from(model, off, tmp_path_factory, data):
    host = data.draw(st.sampled_from([None, "8K"]), label="host_tier")
    store = tmp_path_factory.mktemp("store")
    eng = tiny_engine(
        model, page_size=PS, num_pages=30, chunk_size=24, kv_store=str(store), kv_host_memory=host,
        record_logits=True,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    history: list[list[int]] = []
    for _ in range(data.draw(st.integers(2, 6), label="turns")):
        if history and data.draw(st.booleans(), label="branch"):
            base = data.draw(st.sampled_from(history), label="parent")
            prompt = base[: data.draw(st.integers(1, len(base)), label="cut")] + random_ids(gen, 5)
        else:
            prompt = random_ids(gen, data.draw(st.sampled_from([9, 30, 61, 90]), label="len"))
        prompt = prompt[:100]
        a, b = _run(eng, prompt), _run(off, prompt)
        assert a.output_ids == b.output_ids
        assert_logits_close(a, b)
        assert a.cached_host_tokens + a.cached_disk_tokens <= a.cached_tokens
        history.append(list(a.tokens))
    eng.close()


def test_evicted_pages_come_back_from_disk(model, off, tmp_path):
    eng = tiny_engine(model, page_size=PS, num_pages=24, kv_store=str(tmp_path))
    gen = torch.Generator().manual_seed(1)
    a, b = random_ids(gen, 70), random_ids(gen, 70)
    assert _run(eng, a).cached_tokens == 0
    assert _run(eng, b).cached_tokens == 0  # evicts a (the pool holds 96 tokens) to disk
    ra = _run(eng, a)
    # 17 whole pages of the 69 matched: what eviction left in the pool plus what came back from disk
    assert ra.cached_tokens == 68 and ra.cached_disk_tokens >= 68 - 96 + 70 - 1
    assert ra.output_ids == _run(off, a).output_ids
    assert eng.cache.tier_stats().loaded_disk_pages * PS == ra.cached_disk_tokens
    eng.close()


def test_restart_on_the_same_store(model, off, tmp_path):
    gen = torch.Generator().manual_seed(2)
    turn1 = random_ids(gen, 50)
    eng = tiny_engine(model, page_size=PS, num_pages=256, kv_store=str(tmp_path))
    r1 = _run(eng, turn1)
    eng.close()  # what a SIGTERM does: persist the pool's cache, release the store
    with pytest.raises(EngineError, match="closed"):  # its store is gone: it runs nothing more
        eng.generate([turn1], greedy(1))
    eng2 = tiny_engine(model, page_size=PS, num_pages=256, kv_store=str(tmp_path))
    with pytest.raises(StoreError, match="in use"):  # one server per store
        tiny_engine(model, page_size=PS, kv_store=str(tmp_path))
    turn2 = list(r1.tokens) + random_ids(gen, 9)
    r2 = _run(eng2, turn2)
    full = (len(turn2) - 1) // PS * PS
    assert r2.cached_tokens == r2.cached_disk_tokens == min(full, len(r1.tokens) // PS * PS)
    assert r2.output_ids == _run(off, turn2).output_ids
    eng2.close()


def test_store_of_another_model_is_refused(model, tmp_path, tmp_path_factory):
    eng = tiny_engine(model, page_size=PS, kv_store=str(tmp_path))
    eng.close()
    other = make_tiny_model(tmp_path_factory.mktemp("other") / "m", "llama", seed=7)
    with pytest.raises(StoreError, match="another model"):
        tiny_engine(other, page_size=PS, kv_store=str(tmp_path))
    with pytest.raises(StoreError, match="another model"):  # same weights, other page size
        tiny_engine(model, page_size=8, kv_store=str(tmp_path))


def test_host_tier_alone(model, off, tmp_path):
    eng = tiny_engine(model, page_size=PS, num_pages=24, kv_host_memory="1M")
    gen = torch.Generator().manual_seed(3)
    a, b = random_ids(gen, 70), random_ids(gen, 70)
    _run(eng, a)
    _run(eng, b)
    ra = _run(eng, a)
    assert ra.cached_tokens == 68 and ra.cached_host_tokens > 0 and ra.cached_disk_tokens == 0
    assert ra.output_ids == _run(off, a).output_ids


def test_cache_cli_save_inspect_load_clear(model, tmp_path, capsys):
    from kvreuse.runtime.cli.cache import main

    gen = torch.Generator().manual_seed(4)
    prompts = tmp_path / "prompts.jsonl"
    ids = [random_ids(gen, 40), random_ids(gen, 23)]
    prompts.write_text("\n".join(map(str, ids)) + "\n")
    store = str(tmp_path / "store")
    common = ["--kv-store", store, "--model", str(model), "--dtype", "float32", "--page-size", str(PS)]
    assert main(["save", "--prompt-file", str(prompts), *common]) == 0
    assert "saved 2 prompts (63 tokens)" in capsys.readouterr().out
    assert main(["inspect", "--kv-store", store]) == 0
    info = capsys.readouterr().out
    assert '"pages": 15' in info and '"leaves": 2' in info  # 40//4 + 23//4 whole pages
    assert main(["load", *common]) == 0
    assert "loaded 60 tokens (15 pages)" in capsys.readouterr().out
    assert main(["clear", "--kv-store", store]) == 0
    assert "cleared 15 pages" in capsys.readouterr().out


def test_reset_empties_the_tiers_too(model, tmp_path):
    eng = tiny_engine(model, page_size=PS, num_pages=24, kv_store=str(tmp_path), kv_host_memory="1M")
    gen = torch.Generator().manual_seed(5)
    prompts = [random_ids(gen, 40) for _ in range(3)]  # 3 x 10 pages over a 24-page pool: some go down
    for p in prompts:
        _run(eng, p)
    eng.cache.persist()
    assert eng.cache.tier_stats().disk_pages > 0
    eng.reset_prefix_cache()
    ts = eng.cache.tier_stats()
    assert (ts.host_pages, ts.disk_pages) == (0, 0)
    assert [_run(eng, p).cached_tokens for p in prompts] == [0, 0, 0]  # nothing answers for the pool
    eng.close()


def test_tier_totals_count_each_requests_hit_once(model, off):
    """The engine's cached-tokens-by-tier totals (``/metrics``) are the sums of the requests' own
    splits, even when a request's admission fails or it is retracted after loading pages from a tier
    (those reloads are copies of the same hit, or of its own work, not new cache hits)."""
    eng = tiny_engine(model, page_size=PS, num_pages=56, chunk_size=32, kv_host_memory="1M")
    gen = torch.Generator().manual_seed(5)
    shared = random_ids(gen, 64)
    firsts = [_run(eng, shared), _run(eng, random_ids(gen, 200), n=2)]  # the second pushes `shared` to host
    reqs = [eng.make_request(shared + random_ids(gen, 60), greedy(40)) for _ in range(3)]
    run_checked(eng, reqs)  # 3 x 41 pages do not fit 56: admissions wait, requests are retracted
    done = firsts + reqs
    st = eng.stats()
    assert st.retractions > 0 and any(r.cached_host_tokens for r in reqs)
    assert st.cached_tokens == sum(r.cached_tokens for r in done)
    assert st.host_loaded_tokens == sum(r.cached_host_tokens for r in done)
    for r in reqs:
        assert r.output_ids == _run(off, list(r.tokens[: r.num_prompt]), n=40).output_ids
    eng.close()


def test_the_persist_clock_writes_the_pool_down_once_its_period_has_passed(model, tmp_path):
    """``--kv-store-sync``: the cache's own clock (``CacheManager.tick``, at every engine step) writes the
    pool-only pages to the disk tier once the period has passed, and not before."""
    gen = torch.Generator().manual_seed(5)
    for sync_s, written in ((3600.0, False), (0.0, True)):
        eng = tiny_engine(
            model, page_size=PS, num_pages=256, kv_store=str(tmp_path / str(sync_s)), kv_store_sync_s=sync_s
        )
        _run(eng, random_ids(gen, 50))
        eng.step()  # the next step's tick
        eng.cache.tiers.flush()  # the writer thread's queue, on disk
        assert (eng.cache.tier_stats().disk_pages > 0) is written
        eng.close()
