"""Eviction shadows (``runtime/cache/shadows.py``): each policy's page-only copy of the pool, fed the
finished requests, must hit exactly what the pool itself hits under that policy when requests come one
at a time (the independent figure: the real scheduler and cache manager, run once per policy), and the
server must report those figures the same way in ``/v1/cache`` and ``/metrics``."""

from __future__ import annotations

import argparse

import pytest
from fastapi.testclient import TestClient

from kvreuse.benchmarks.traces.belady import replay
from kvreuse.benchmarks.traces.eviction_traces import PAGE, traces
from kvreuse.runtime.cache.eviction import POLICIES
from kvreuse.runtime.cache.manager import CacheManager
from kvreuse.runtime.engine.args import add_engine_args
from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig
from tests.helpers import make_tiny_hybrid, make_tiny_model, metric_value

pytestmark = pytest.mark.timeout(300)
CHUNK = 64  # below the traces' prompt lengths, so prefills take several chunks


@pytest.mark.parametrize("serving", ["hazard", "lru"])
def test_each_shadow_hits_what_the_pool_hits_under_its_policy(serving):
    """Every policy, on the three agent traces: a shadow's cached tokens equal the real pool's under
    that policy, in sum over each trace; the serving policy's own shadow equals what was served.  (A
    shadow that prefilled each request in one piece, not chunk by chunk as the scheduler does, fails
    here: the stateful policies' clock counts the inserts.)"""
    for name, (trace, pool) in traces(quick=True).items():
        cache = CacheManager(pool, PAGE, "radix", serving, shadows=list(POLICIES), chunk_size=CHUNK)
        shadows = cache.shadows
        served = replay(trace, pool, PAGE, serving, chunk_size=CHUNK, check=False, cache=cache)
        st = shadows.stats()
        assert st.prompt_tokens == sum(len(p) for p, _ in trace)
        assert st.served_tokens == sum(served) == st.cached_tokens[serving], name
        for policy in POLICIES:
            own = sum(replay(trace, pool, PAGE, policy, chunk_size=CHUNK, check=False))
            assert st.cached_tokens[policy] == own, (name, policy, st.cached_tokens[policy], own)
        shadows.check()
        assert len(set(st.cached_tokens.values())) > 2, st  # the policies do differ on these traces


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("shadows") / "m", vocab=49152)


def test_the_server_reports_the_shadows_in_v1_cache_and_metrics(model_dir):
    engine = Engine(model_dir=str(model_dir), dtype="float32", device="cpu", num_pages=24, page_size=16,
                    eviction_policy="hazard", eviction_shadows=("lru", "hazard"))  # fmt: skip
    aengine = AsyncEngine(engine)
    app = create_app(aengine, ServerConfig("tiny"), on_shutdown=aengine.shutdown)
    topics = [" ".join(f"{t}{i}" for i in range(60)) for t in ("alpha", "beta", "gamma")]
    served = prompt = 0
    with TestClient(app, base_url="http://127.0.0.1") as c:
        for round_ in range(3):  # three prompts in a pool that holds about two: evictions
            for t in topics:
                body = {"model": "tiny", "prompt": f"{t} round {round_}", "max_tokens": 3, "temperature": 0}
                usage = c.post("/v1/completions", json=body).json()["usage"]
                served += usage["prompt_tokens_details"]["cached_tokens"]
                prompt += usage["prompt_tokens"]
        view = c.get("/v1/cache").json()["eviction_shadows"]
        metrics = c.get("/metrics").text
    assert engine.stats().evicted_pages > 0
    assert view["prompt_tokens"] == prompt and view["served"]["cached_tokens"] == served > 0
    assert view["served"]["policy"] == "hazard"
    assert view["policies"]["hazard"]["cached_tokens"] == served  # one request at a time: the pool itself
    assert view["policies"]["hazard"]["hit_rate"] == round(served / prompt, 4)
    assert metric_value(metrics, "kvreuse_eviction_shadow_prompt_tokens_total") == prompt
    assert metric_value(metrics, "kvreuse_eviction_shadow_served_tokens_total") == served
    for policy in ("lru", "hazard"):
        cached = view["policies"][policy]["cached_tokens"]
        assert (
            metric_value(metrics, "kvreuse_eviction_shadow_cached_tokens_total", f'{{policy="{policy}"}}')
            == cached
        )


def test_bad_shadow_policies_are_one_line_errors(tmp_path, capsys):
    p = argparse.ArgumentParser()
    add_engine_args(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--eviction-shadows", "lru,mru"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "unknown policy mru" in err and "lru" in err
    assert p.parse_args(["--eviction-shadows", "lru, answer"]).eviction_shadows == ("lru", "answer")
    hybrid = make_tiny_hybrid(tmp_path / "h", "gqa-3to1-untied")
    with pytest.raises(ValueError, match="full-attention pool"):
        Engine(model_dir=str(hybrid), dtype="float32", device="cpu", num_pages=32, eviction_shadows=("lru",))
