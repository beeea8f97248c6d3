"""The live page's data route in-process (tiny random model): records bounded per tenant and equal to
the API's usage, ``after`` paging, bad input as a 400, cached tokens by tier and the tiers' occupancy,
Anthropic requests, ``ui=False`` (``--no-ui``) serving nothing, and the shared store's URL shown
without its password."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from kvreuse.runtime.cache.store.shared import public_url
from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig
from tests.helpers import chat_topic, make_tiny_model

pytestmark = pytest.mark.timeout(300)
PROMPT = " ".join(f"word{i}" for i in range(60))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("ui") / "m", vocab=49152)


def _client(model_dir, engine_options: dict | None = None, **config) -> TestClient:
    options = {"num_pages": 128, **(engine_options or {})}
    engine = Engine(model_dir=str(model_dir), dtype="float32", device="cpu", page_size=16, **options)
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
        assert live["tiers"]["shared"] is None  # no --kv-shared-store
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


def test_tiers_and_anthropic_requests(model_dir, tmp_path):
    # 40 pool pages: one ~300-token conversation fits, two do not, so the first goes down the tiers
    options = {"num_pages": 40, "kv_store": str(tmp_path / "store"), "kv_host_memory": "1M"}
    with _client(model_dir, options) as c:
        chat_topic(c, "alpha"), chat_topic(c, "beta")
        again = chat_topic(c, "alpha")
        by_tier = again["kvreuse"]["cache"]["cached_by_tier"]
        assert by_tier["host"] + by_tier["disk"] > 0, by_tier  # loaded back from a lower tier
        body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": PROMPT}]}
        msg = c.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}).json()
        live = c.get("/ui/api/live").json()
        rec = {r["id"]: r for r in live["requests"]}
        shown = rec[again["id"]]["cached_by_tier"]
        assert shown == {k: by_tier[k] for k in ("pool", "host", "disk", "shared")}
        assert rec[msg["id"]]["cache"]["cause"] == "new_conversation"
        u, m = msg["usage"], rec[msg["id"]]
        assert m["cached_tokens"] == u["cache_read_input_tokens"]
        assert m["prefilled_tokens"] == u["input_tokens"] + u["cache_creation_input_tokens"]
        tiers = live["tiers"]
        assert tiers["host"]["pages"] + tiers["disk"]["pages"] > 0 and tiers["disk"]["budget_bytes"] > 0
        assert tiers["host"]["capacity_pages"] == (1 << 20) // tiers["page_bytes"]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("valkey://127.0.0.1:6379", "valkey://127.0.0.1:6379"),
        ("valkey://:s3cret@store:6379/2", "valkey://store:6379/2"),
        ("redis://ops:s3cret@[::1]:6380", "redis://ops@[::1]:6380"),
        ("unix:///run/valkey.sock?db=1&password=s3cret", "unix:///run/valkey.sock?db=1"),
    ],
)
def test_the_shared_store_url_is_shown_without_its_password(url, shown):
    assert public_url(url) == shown


def _strip_times(obj):
    """The live JSON less what moves with the clock (``now``, pins' TTL left)."""
    if isinstance(obj, dict):
        return {k: _strip_times(v) for k, v in obj.items() if k not in ("now", "ttl_left_s")}
    if isinstance(obj, list):
        return [_strip_times(v) for v in obj]
    return obj


def test_a_tenants_live_view_carries_only_what_its_cache_route_does(model_dir):
    """Issue 51 row 6: a tenant's live view showed the whole pool (free 1,456 -> 1,445, pinned 0 -> 11
    after another tenant's one request), running and in-flight counts, and "evicted pages NaN"."""
    keys = {"key-a": "A", "key-b": "B", "key-op": "@operator"}
    with _client(model_dir, api_keys=keys) as c:
        auth = {k: {"Authorization": f"Bearer {k}"} for k in keys}
        before = c.get("/ui/api/live", headers=auth["key-a"]).json()
        r = c.post("/v1/completions", headers={**auth["key-b"], "X-Session-Id": "s1"},
                   json={"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "temperature": 0})  # fmt: skip
        assert r.status_code == 200, r.text
        after = c.get("/ui/api/live", headers=auth["key-a"]).json()
        assert _strip_times(after) == _strip_times(before)  # B's request moved nothing A sees
        own = c.get("/v1/cache", headers=auth["key-a"]).json()
        assert after["cache"] == own and after["engine"] is None
        assert after["tiers"]["pool"] == {"total": own["pages"]["total"], "pinned": own["pages"]["pinned"]}
        op = c.get("/ui/api/live", headers=auth["key-op"]).json()  # the operator still sees the pool
        assert op["tiers"]["pool"]["pinned"] > 0 and op["engine"]["running"] == 0
