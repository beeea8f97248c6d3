"""The tier split of cached tokens through the server: the ``kvreuse.cache.cached_by_tier`` object of a
chat response and the Prometheus counters, with a pool too small for two conversations and a disk
tier below it. Expected values come from the engine's own per-request counts and from the totals."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig
from tests.helpers import chat_topic, make_tiny_model, metric_value

pytestmark = pytest.mark.timeout(300)
PS = 16


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    model_dir = make_tiny_model(tmp_path_factory.mktemp("tiers") / "m", vocab=49152)
    store = tmp_path_factory.mktemp("store")
    # 40 pages of 16: one ~300-token conversation fits, two do not, so the first goes down to disk
    engine = Engine(model_dir=str(model_dir), dtype="float32", device="cpu", num_pages=40, page_size=PS,
                    kv_store=str(store))  # fmt: skip
    aengine = AsyncEngine(engine)
    app = create_app(aengine, ServerConfig("tiny"), on_shutdown=aengine.shutdown)
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as c:
        yield c


def _chat(client, topic: str) -> dict:
    return chat_topic(client, topic)


_metric = metric_value


def test_hits_say_which_tier_they_came_from(client):
    first = _chat(client, "alpha")
    assert first["kvreuse"]["cache"]["cached_by_tier"] == {
        "pool": 0,
        "host": 0,
        "disk": 0,
        "shared": 0,
        "load_ms": 0.0,
    }
    _chat(client, "beta")  # evicts alpha's pages from the pool: they go to the disk tier
    again = _chat(client, "alpha")
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    split = again["kvreuse"]["cache"]["cached_by_tier"]
    assert cached > 0 and split["disk"] > 0, split  # alpha came back from disk, not recomputed
    assert split["pool"] + split["host"] + split["disk"] == cached
    assert split["load_ms"] > 0

    metrics = client.get("/metrics").text
    by_tier = {t: _metric(metrics, "kvreuse_cached_tokens_by_tier_total", f'{{tier="{t}"}}')
               for t in ("pool", "host", "disk")}  # fmt: skip
    assert sum(by_tier.values()) == _metric(metrics, "kvreuse_cached_tokens_total")
    assert by_tier["disk"] >= split["disk"]
    assert _metric(metrics, "kvreuse_kv_tier_load_seconds_total") > 0
    assert _metric(metrics, "kvreuse_kv_tier_pages", '{tier="disk"}') > 0
