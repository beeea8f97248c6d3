"""The live page's data route in-process (tiny random model): records bounded per tenant and equal to
the API's usage, ``after`` paging, bad input as a 400, and ``ui=False`` (``--no-ui``) serving nothing."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from runtime.engine.async_engine import AsyncEngine
from runtime.engine.engine import Engine
from runtime.server.app import create_app
from runtime.server.state import ServerConfig
from tests.helpers import make_tiny_model

pytestmark = pytest.mark.timeout(300)
PROMPT = " ".join(f"word{i}" for i in range(60))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("ui") / "m", vocab=49152)


def _client(model_dir, **config) -> TestClient:
    engine = Engine(model_dir=str(model_dir), dtype="float32", device="cpu", num_pages=128, page_size=16)
    aengine = AsyncEngine(engine)
    app = create_app(aengine, ServerConfig("tiny", **config), on_shutdown=aengine.shutdown)
    return TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False)


def _complete(c: TestClient, prompt: str) -> dict:
    r = c.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def test_records_are_bounded_and_match_usage(model_dir):
    with _client(model_dir, ui_history=3) as c:
        bodies = [_complete(c, PROMPT + f" tail {k}") for k in range(5)]
        live = c.get("/ui/api/live").json()
        recs = live["requests"]
        assert [r["id"] for r in recs] == [b["id"] for b in bodies[-3:]]  # the ring keeps the last 3
        for r, b in zip(recs, bodies[-3:]):
            u = b["usage"]
            cached = u["prompt_tokens_details"]["cached_tokens"]
            assert (r["prompt_tokens"], r["cached_tokens"]) == (u["prompt_tokens"], cached)
            assert r["prefilled_tokens"] == u["prompt_tokens"] - cached
            assert r["generated_tokens"] == u["completion_tokens"]
            assert sum(r["cached_by_tier"].values()) == cached and r["cache"] is None  # no chat diagnosis
        assert cached > 0  # later prompts hit the shared prefix
        after = recs[-2]["seq"]
        assert [r["id"] for r in c.get(f"/ui/api/live?after={after}").json()["requests"]] == [
            bodies[-1]["id"]
        ]
        pool = live["tiers"]["pool"]
        assert pool["total"] == 128 and pool["free"] + pool["in_use"] + pool["pinned"] + pool["cached"] == 128
        r = c.get("/ui/api/live?after=-1")
        assert r.status_code == 400 and r.json()["error"]["param"] == "after"
        assert c.get("/ui/static/../state.py").status_code == 404
        page = c.get("/ui")
        assert page.status_code == 200 and "frame-ancestors 'none'" in page.headers["content-security-policy"]


def test_no_ui_serves_and_keeps_nothing(model_dir):
    with _client(model_dir, ui=False) as c:
        _complete(c, PROMPT)
        for path in ("/ui", "/ui/static/ui.js", "/ui/api/live"):
            assert c.get(path).status_code == 404, path
        assert c.app.state.kv.activity.since(None) == []
