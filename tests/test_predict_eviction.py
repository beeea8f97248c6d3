"""The ``predict`` eviction policy: its online model of return, learned from the cache's own traffic,
must carry the order (a constant in its place is LRU), and its labelled outcomes must say so."""

from __future__ import annotations

import math
import random

import pytest
from fastapi.testclient import TestClient

from kvreuse.benchmarks.traces.belady import belady, replay
from kvreuse.runtime.cache import predict
from kvreuse.runtime.cache.manager import CacheManager
from kvreuse.runtime.cache.return_model import Outcomes, ReturnModel
from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig
from tests.helpers import make_tiny_model
from tests.test_eviction import _documents_and_chats


def _rate(trace, pool: int, page: int, policy: str, constant: float | None = None) -> tuple[float, dict]:
    cache = CacheManager(pool, page, "radix", policy)
    pol = cache.prefix.policy
    if constant is not None:
        pol.model.log_odds = lambda x: math.log(constant / (1 - constant))
    hits = replay(trace, pool, page, policy, cache=cache)
    return sum(hits) / sum(len(p) for p, _ in trace), pol.predictor() or {}


def test_the_predictor_carries_the_order_a_constant_in_its_place_does_not():
    """Documents asked a short question come back, chats answered at length never do: every prefix
    enters as a first turn, so only the learned model tells them apart.  With the model replaced by
    a constant the policy is LRU, which keeps nothing here."""
    trace, pool, page = _documents_and_chats(n_docs=96), 32, 4
    total = sum(len(p) for p, _ in trace)
    opt = sum(belady(trace, pool, page)) / total
    lru, _ = _rate(trace, pool, page, "lru")
    learned, stats = _rate(trace, pool, page, "predict")
    constant, _ = _rate(trace, pool, page, "predict", constant=0.5)
    assert constant == lru == 0, (constant, lru)
    assert learned >= 0.6 * opt, (learned, opt)
    # what it kept came back more often than what it evicted, on labels it saw only afterwards
    assert stats["kept"]["return_rate"] > 2 * stats["evicted"]["return_rate"], stats


def test_differences_within_a_log_odds_bin_leave_the_order_to_recency():
    """A model that tells nodes apart by less than a bin of log-odds (noise around one value) must
    not override recency: the policy hits exactly what a constant model (least recently used first)
    hits.  Ordered by the exact probability (before the bins) the noise reordered the pool, as it
    cost the conversation trace's 30% pool (0.80x LRU, ``docs/traces.md``)."""
    trace, pool, page = _documents_and_chats(n_docs=96), 48, 4
    constant, _ = _rate(trace, pool, page, "predict", constant=0.5)
    cache = CacheManager(pool, page, "radix", "predict")
    # noise that depends on the node's features (class, idle time, lengths), all in the bin above 0.5
    cache.prefix.policy.model.log_odds = lambda x: 0.9 * predict.LOGIT_BIN * (hash(tuple(x)) % 1000 / 1000)
    hits = replay(trace, pool, page, "predict", cache=cache)
    assert sum(hits) / sum(len(p) for p, _ in trace) == constant > 0


def test_the_model_is_calibrated_on_a_known_rule():
    """Examples drawn from a known logistic rule: the model's predictions by decile match the
    observed rates (the rule's own probabilities are the independent reference)."""
    rng = random.Random(1)
    model, out = ReturnModel(3), Outcomes()
    for i in range(40_000):
        a, b = rng.random() < 0.5, rng.random() < 0.3
        p_true = 1 / (1 + 2.718281828 ** -(-1.5 + 2.5 * a - 1.0 * b))
        y = rng.random() < p_true
        p = model.learn([(0, 1.0), (1, float(a)), (2, float(b))], y)
        if i >= 20_000:
            out.add(p, y, evicted=p < 0.3)
    for c in out.summary()["calibration"]:
        if c["n"] >= 1000:
            assert abs(c["predicted"] - c["observed"]) < 0.04, c
    s = out.summary()
    assert s["kept"]["return_rate"] > s["evicted"]["return_rate"] + 0.3, s


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("predict") / "m", vocab=49152)


@pytest.mark.timeout(300)
def test_the_server_shows_the_predictors_kept_and_evicted_return_rates(model_dir, monkeypatch):
    """``GET /v1/cache`` (operator view) carries the policy's own labelled figures; a policy that
    learns nothing (``hazard``) shows no predictor.  Every node sampled: a short run has few."""
    monkeypatch.setattr(predict, "SAMPLE_EVERY", 1)
    views = {}
    for policy in ("predict", "hazard"):
        engine = Engine(model_dir=str(model_dir), dtype="float32", device="cpu", num_pages=24, page_size=16,
                        eviction_policy=policy)  # fmt: skip
        aengine = AsyncEngine(engine)
        app = create_app(aengine, ServerConfig("tiny"), on_shutdown=aengine.shutdown)
        topics = [
            " ".join(f"{t}{i}" for i in range(60))
            for t in ("alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta")
        ]
        with TestClient(app, base_url="http://127.0.0.1") as c:
            for round_ in range(6):  # eight prompts in a pool that holds about two: evictions and returns
                for t in topics:
                    body = {
                        "model": "tiny",
                        "prompt": f"{t} round {round_}",
                        "max_tokens": 2,
                        "temperature": 0,
                    }
                    assert c.post("/v1/completions", json=body).status_code == 200
            views[policy] = c.get("/v1/cache").json()
        assert engine.stats().evicted_pages > 0
        if policy == "predict":
            assert views[policy]["eviction_predictor"] == engine.cache.prefix.policy.predictor()
    shown = views["predict"]["eviction_predictor"]
    assert (
        shown["labelled"] > 0
        and shown["labelled"] == shown["kept"]["labelled"] + shown["evicted"]["labelled"]
    )
    assert sum(c["n"] for c in shown["calibration"]) == shown["labelled"]
    assert "eviction_predictor" not in views["hazard"]
