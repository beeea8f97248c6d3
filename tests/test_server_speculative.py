"""Speculative decoding through the server: drafted / accepted tokens in the ``kvreuse`` extension of a
chat response, equal to the Prometheus counters' increase; output equal to a server without it."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig
from tests.helpers import make_tiny_model, metric_value

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("spec") / "m", vocab=49152)


def _client(model_dir, mode: str):
    engine = Engine(model_dir=str(model_dir), dtype="float32", device="cpu", num_pages=128, speculative=mode)
    aengine = AsyncEngine(engine)
    app = create_app(aengine, ServerConfig("tiny"), on_shutdown=aengine.shutdown)
    return TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False)


_metric = metric_value


def test_drafted_and_accepted_tokens_are_reported_and_counted(model_dir):
    words = " ".join(f"item{i % 7} value{i % 5}" for i in range(60))
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": words}],
        "max_tokens": 48,
        "temperature": 0,
    }
    with _client(model_dir, "off") as off:
        plain = off.post("/v1/chat/completions", json=body).json()
    with _client(model_dir, "ngram") as c:
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        spec = r.json()
        metrics = c.get("/metrics").text
    assert spec["choices"][0]["message"] == plain["choices"][0]["message"]
    assert plain["kvreuse"]["speculative"] == {"drafted_tokens": 0, "accepted_tokens": 0}
    got = spec["kvreuse"]["speculative"]
    assert got["drafted_tokens"] > 0 and 0 <= got["accepted_tokens"] <= got["drafted_tokens"]
    assert _metric(metrics, "kvreuse_speculative_drafted_tokens_total") == got["drafted_tokens"]
    assert _metric(metrics, "kvreuse_speculative_accepted_tokens_total") == got["accepted_tokens"]
