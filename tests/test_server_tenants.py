"""API keys and tenants through the app (in-process, real engine on a tiny model): 401 on every
route without a key, no cross-tenant cache hits, sessions, and the per-tenant cap under a flood."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi.testclient import TestClient

from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig
from kvreuse.runtime.server.tenants import load_keys
from kvreuse.runtime.server.ui.routes import is_page
from tests.helpers import make_tiny_model

pytestmark = pytest.mark.timeout(300)
KEYS = {"key-a": "A", "key-b": "B", "key-op": "@operator"}
PROMPT = " ".join(f"word{i}" for i in range(120))


def _app(model_dir, **config):
    engine = Engine(model_dir=str(model_dir), dtype="float32", device="cpu", num_pages=256, page_size=16)
    aengine = AsyncEngine(engine)
    cfg = ServerConfig("tiny", api_keys=KEYS, **config)
    return create_app(aengine, cfg, on_shutdown=aengine.shutdown)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random model with the embedded tokenizer's whole vocabulary, so text prompts work."""
    return make_tiny_model(tmp_path_factory.mktemp("tenants") / "m", vocab=49152)


@pytest.fixture(scope="module")
def client(model_dir):
    with TestClient(_app(model_dir), base_url="http://127.0.0.1", raise_server_exceptions=False) as c:
        yield c


def _complete(client, key, prompt=PROMPT, **extra):
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0, **extra}
    r = client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_every_route_but_health_needs_a_key(client):
    routes = [(m, r.path) for r in client.app.routes for m in getattr(r, "methods", ()) if m != "HEAD"]
    assert len(routes) >= 8  # the API routes and the OpenAPI pages
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "key-a "}):
            r = client.request(method, path, headers=headers)
            if path == "/health":
                assert r.status_code == 200, (method, path)
            elif is_page(
                path
            ):  # the live page's own files: the same for all, no data (its data route is 401)
                kind = r.headers["content-type"].split(";")[0]
                assert r.status_code == 404 or kind in ("text/html", "text/javascript", "text/css"), path
            else:
                assert r.status_code == 401, (method, path, headers, r.status_code)
                assert r.json()["error"]["type"] == "authentication_error"
    assert client.get("/v1/models", headers={"Authorization": "Bearer key-a"}).status_code == 200
    assert client.get("/metrics", headers={"x-api-key": "key-b"}).status_code == 403  # every tenant's traffic
    assert client.get("/metrics", headers={"x-api-key": "key-op"}).status_code == 200  # the operator's
    r = client.post("/v1/cache/reset", json={}, headers={"Authorization": "Bearer key-a"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"  # not everyone's cache


def test_tenant_b_gets_nothing_from_tenant_a(client):
    prompt = "isolation " + PROMPT  # no other test sends it: A's first request finds nothing of its own
    assert _complete(client, "key-a", prompt) == 0
    assert _complete(client, "key-b", prompt) == 0  # A's exact prompt
    assert _complete(client, "key-a", prompt) > 0  # A's own prefix is cached


def test_session_is_pinned_per_tenant(client):
    _complete(client, "key-a", prompt=PROMPT + " session", user="s1")
    pins = client.app.state.kv.engine.cache.pins
    assert [p.owner for p in pins.info()][-1] == ("A", "s1")
    body = {"model": "tiny", "prompt": PROMPT + " header", "max_tokens": 2}
    r = client.post(
        "/v1/completions", json=body, headers={"Authorization": "Bearer key-b", "X-Session-Id": "s1"}
    )
    assert r.status_code == 200 and [p.owner for p in pins.info()][-1] == ("B", "s1")
    assert ("A", "s1") in pins  # same session id, another tenant: another pin


def test_load_keys_file(tmp_path):
    f = tmp_path / "keys"
    f.write_text("# comment\nk1 alice\nk2\n\n")
    keys = load_keys(["k3"], f)
    assert keys["k1"] == "alice" and keys["k2"].startswith("key-") and "k2" not in keys["k2"]
    f.write_text("k1 a b\n")
    with pytest.raises(ValueError, match="expected 'key"):
        load_keys(None, f)


def test_a_flooding_tenant_gets_429s_while_another_completes(model_dir):
    app = _app(model_dir, tenant_max_requests=2)

    async def flood():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=120) as c:

            async def one(key, i):
                body = {"model": "tiny", "prompt": f"{i} " + PROMPT, "max_tokens": 16, "temperature": 0}
                return await c.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})

            flood = [one("key-a", i) for i in range(12)]
            other = [one("key-b", 100 + i) for i in range(2)]
            return await asyncio.gather(*flood, *other)

    try:
        results = asyncio.run(flood())
    finally:
        app.state.kv.aengine.shutdown()
    a, b = results[:12], results[12:]
    assert all(r.status_code == 200 for r in b), [r.text for r in b]
    rejected = [r for r in a if r.status_code == 429]
    assert rejected and all(r.headers["Retry-After"] == "1" for r in rejected)
    assert all(r.status_code in (200, 429) for r in a) and any(r.status_code == 200 for r in a)
    assert app.state.kv.tenants.in_flight["A"] == 0 == app.state.kv.tenants.in_flight["B"]


SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {i}: be brief." for i in range(30))


def _chat(client, key, messages, **extra):
    body = {"model": "tiny", "messages": messages, "max_tokens": 2, "temperature": 0, **extra}
    r = client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_public_system_prompt_opt_in_shares_only_the_system_part(model_dir):
    app = _app(model_dir, public_system_prompt=SYSTEM)
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as c:
        sys_msg = {"role": "system", "content": SYSTEM}
        history = [sys_msg, {"role": "user", "content": "private question of A " * 20}]
        assert _chat(c, "key-a", history) == 0
        shared = _chat(c, "key-b", history)  # A's exact prompt: only the public part is reused
        n_system = len(c.app.state.kv.tokenizer(SYSTEM)["input_ids"])
        assert 0 < shared <= n_system + 16 and shared % 16 == 0
        other = _chat(c, "key-b", [sys_msg, {"role": "user", "content": "something else"}])
        assert other == shared  # B's own different question: the same public part, nothing more
        assert _chat(c, "key-a", history) > shared  # A still has its private part too
        unlisted = [{"role": "system", "content": SYSTEM + " extra"}, history[1]]
        assert _chat(c, "key-a", unlisted) == 0 and _chat(c, "key-b", unlisted) == 0


def test_prewarm_pins_a_prefix_and_introspection_shows_only_own_pins(client):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "plan the sub-tasks"}]
    h_a, h_b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    r = client.post("/v1/cache/prewarm", json={"model": "tiny", "messages": messages}, headers=h_a)
    assert r.status_code == 200, r.text
    pre = r.json()
    assert pre["pinned"] and pre["already_cached_tokens"] == 0
    assert pre["cached_tokens"] == pre["prompt_tokens"] // 16 * 16 > 0
    mine = client.get("/v1/cache", headers=h_a)
    assert mine.status_code == 200
    info = mine.json()
    assert [p["id"] for p in info["prewarmed"]] == [pre["id"]]
    assert info["prewarmed"][0]["pinned_tokens"] >= pre["cached_tokens"]
    assert 0 < info["prewarmed"][0]["ttl_left_s"] <= 300
    assert info["pages"]["pinned"] >= pre["cached_tokens"] // 16
    assert "Rule 1" not in mine.text and "sub-tasks" not in mine.text  # no token content
    theirs = client.get("/v1/cache", headers=h_b).json()
    assert theirs["prewarmed"] == []  # A's prewarmed prefix is invisible to B
    owners = {p.owner for p in client.app.state.kv.engine.cache.pins.info()}
    assert {s["id"] for s in theirs["sessions"]} == {o[1] for o in owners if o[0] == "B" and len(o) == 2}
    # a sub-agent: the same system + a different task reuses the prewarmed system part
    sub = [messages[0], {"role": "user", "content": "sub-task 3: check the logs"}]
    assert _chat(client, "key-a", sub) > 0
    assert _chat(client, "key-b", sub) == 0
    metrics = client.get("/metrics", headers={"Authorization": "Bearer key-op"}).text
    assert "kvreuse_kv_pages_pinned" in metrics and 'kvreuse_pin_lapses_total{cause="ttl"}' in metrics
