"""Issue 12 against the in-process app (real embedded engine): tiny temperatures, diagnostics that show
only the requester's own text, tokenizer errors and strict types as 400s, cheap limits before the
render, Host / content-type / CORS checks, and the smaller points (n, model echo, OpenAPI)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from fastapi.testclient import TestClient

from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig

pytestmark = pytest.mark.timeout(300)

MAX_LEN = 256
SECRET = "my password is hunter2-zebra and my PIN is 4417"


@pytest.fixture(scope="module")
def engine():
    """One engine loop for every app below (two loops must never step one engine)."""
    aengine = AsyncEngine(Engine(None, kv_cache_memory="64M", max_model_len=MAX_LEN, max_running=2))
    yield aengine
    aengine.shutdown()


def _client(aengine: AsyncEngine, **config) -> TestClient:
    app = create_app(aengine, ServerConfig("smol", max_waiting=1, **config))
    return TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False)


@pytest.fixture(scope="module")
def client(engine):
    with _client(engine) as c:
        yield c


def _post(client, path: str, body: dict | str, **headers):
    content = body if isinstance(body, str) else json.dumps(body)
    return client.post(path, content=content, headers={"content-type": "application/json", **headers})


def _error(resp, status: int) -> dict:
    assert resp.status_code == status, resp.text
    return resp.json()["error"]


# -- 1. tiny temperatures ------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-38])
def test_tiny_temperature_is_served_and_the_engine_lives(client, temperature):
    greedy = _post(client, "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 2})
    body = {"prompt": "The capital of France is", "max_tokens": 2, "temperature": temperature}
    r = _post(client, "/v1/completions", body)
    assert r.status_code == 200, r.text
    greedy = _post(client, "/v1/completions", {**body, "temperature": 0})
    assert r.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": temperature}
    assert _post(client, "/v1/chat/completions", chat).status_code == 200
    assert client.get("/health").json()["status"] == "ok"
    assert client.get("/metrics").status_code == 200 and client.get("/debug/kv").json()["ok"]


# -- 2. diagnostics never show another request's content ----------------------------------------
def test_diagnostics_show_only_the_requesters_own_text(client):
    system = "You are the support assistant of ACME. Answer briefly and politely, in English."
    a = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": SECRET}]}
    _post(client, "/v1/chat/completions", {**a, "max_tokens": 1, "temperature": 0}).raise_for_status()
    b = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hello"}]}
    r = _post(client, "/v1/chat/completions", {**b, "max_tokens": 1, "temperature": 0}).json()
    diag = r["kvreuse"]["cache"]
    assert diag["divergence"]["message_index"] == 1  # located in B's own message 1 ...
    assert diag["divergence"]["new_text"].startswith("Hello")  # ... with B's own text
    shown = json.dumps(r)
    for word in ("password", "hunter2", "zebra", "4417", "PIN"):
        assert word not in shown, word
    # B sends what it saw: still nothing of A's comes back
    b2 = {"messages": [*b["messages"][:1], {"role": "user", "content": "my "}]}
    r2 = _post(client, "/v1/chat/completions", {**b2, "max_tokens": 1, "temperature": 0}).json()
    assert "password" not in json.dumps(r2) and "hunter2" not in json.dumps(r2)


def test_system_changed_detail_shows_only_the_new_system_prompt(client):
    user = {"role": "user", "content": "What is the refund policy?"}
    old = {"messages": [{"role": "system", "content": "Support bot. Tenant: globex-secret-77."}, user]}
    new = {"messages": [{"role": "system", "content": "Support bot. Tenant: initech."}, user]}
    for body in (old, new):
        r = _post(client, "/v1/chat/completions", {**body, "max_tokens": 1, "temperature": 0})
    diag = r.json()["kvreuse"]["cache"]
    assert diag["cause"] == "system_changed" and "initech" in diag["detail"]
    assert "globex" not in json.dumps(diag) and "secret-77" not in json.dumps(diag)


# -- 4. tokenizer errors and strict types are 400s ----------------------------------------------
@pytest.mark.parametrize(
    "path,raw",
    [
        ("/v1/completions", '{"prompt": "Hello \\ud800 world", "max_tokens": 2}'),
        ("/v1/completions", '{"prompt": ["x\\udfff"], "max_tokens": 2}'),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a\\ud800"}], "max_tokens": 2}'),
    ],
)
def test_lone_surrogates_are_400(client, path, raw):
    err = _error(_post(client, path, raw), 400)
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "field,value",
    [
        ("max_tokens", "2"),
        ("stream", "yes"),
        ("prompt", [True, False]),
        ("temperature", "0.5"),
        ("n", True),
        ("logprobs", "1"),
        ("seed", 1.5),
        ("echo", 1),
    ],
)
def test_no_coercion_of_request_fields(client, field, value):
    body = {"prompt": "Hi", "max_tokens": 2, field: value}
    err = _error(_post(client, "/v1/completions", body), 400)
    assert err["param"] is not None and err["param"].startswith(field)


def test_error_codes_come_from_the_exception(client):
    long = {"prompt": "word " * 400, "max_tokens": 2}
    assert _error(_post(client, "/v1/completions", long), 400)["code"] == "context_length_exceeded"
    bad_ids = {"prompt": [10**9], "max_tokens": 2}
    assert _error(_post(client, "/v1/completions", bad_ids), 400)["code"] is None


# -- 5. cheap limits before the render ----------------------------------------------------------
def test_too_many_messages_are_refused_before_rendering_and_health_stays_fast(client):
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(16_000)]
    body = json.dumps({"messages": msgs, "max_tokens": 1})
    health: list[float] = []

    def probe():
        time.sleep(0.05)
        t0 = time.perf_counter()
        client.get("/health").raise_for_status()
        health.append(time.perf_counter() - t0)

    th = threading.Thread(target=probe)
    th.start()
    t0 = time.perf_counter()
    err = _error(_post(client, "/v1/chat/completions", body), 400)
    took = time.perf_counter() - t0
    th.join()
    assert err["code"] == "context_length_exceeded" and "16000 messages" in err["message"]
    assert took < 5 and health[0] < 1.0, (took, health)


def test_body_size_limit(engine):
    with _client(engine, max_request_bytes=1000) as c:
        err = _error(_post(c, "/v1/completions", {"prompt": "x" * 2000, "max_tokens": 1}), 413)
        assert "max-request-bytes" in err["message"]

        def chunks():  # no Content-Length: counted as it arrives
            yield b'{"prompt": "'
            for _ in range(10):
                yield b"y" * 200
            yield b'", "max_tokens": 1}'

        r = c.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
        assert _error(r, 413)
        assert _post(c, "/v1/completions", {"prompt": "Hi", "max_tokens": 1}).status_code == 200


# -- 6. Host allow-list, JSON-only POSTs, CORS closed by default ---------------------------------
def test_foreign_host_header_is_refused(client):
    r = _post(client, "/v1/completions", {"prompt": "Hi", "max_tokens": 1}, host="attacker.example")
    assert _error(r, 400)["code"] == "invalid_host"
    assert client.get("/health", headers={"host": "attacker.example:8000"}).status_code == 400
    for host in ("localhost:8000", "127.0.0.1", "[::1]:8000"):
        assert client.get("/health", headers={"host": host}).status_code == 200, host


def test_simple_cross_origin_posts_change_nothing(client):
    warm = "warm the cache with a prompt longer than one page of sixteen tokens, so it holds a page"
    _post(client, "/v1/chat/completions", {"messages": [{"role": "user", "content": warm}], "max_tokens": 1})
    before = client.get("/debug/kv").json()["stats"]["tree_pages"]
    assert before > 0
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None):
        headers = {"origin": "http://evil.example", **({"content-type": ctype} if ctype else {})}
        r = client.post("/v1/cache/reset", content=b"{}", headers=headers)
        assert _error(r, 415)["code"] == "unsupported_media_type"
        assert "access-control-allow-origin" not in r.headers
    assert client.get("/debug/kv").json()["stats"]["tree_pages"] == before  # not flushed
    pre = client.options(
        "/v1/cache/reset",
        headers={"origin": "http://evil.example", "access-control-request-method": "POST"},
    )
    assert "access-control-allow-origin" not in pre.headers  # CORS closed: the preflight fails


def test_cors_can_be_opened_for_one_origin(engine):
    with _client(engine, cors_origins=("http://localhost:3000",)) as c:
        pre = c.options(
            "/v1/completions",
            headers={
                "origin": "http://localhost:3000",
                "access-control-request-method": "POST",
                "access-control-request-headers": "content-type",
            },
        )
        assert pre.headers.get("access-control-allow-origin") == "http://localhost:3000"
        other = c.options(
            "/v1/completions",
            headers={"origin": "http://evil.example", "access-control-request-method": "POST"},
        )
        assert other.headers.get("access-control-allow-origin") is None


# -- 7. the smaller points ----------------------------------------------------------------------
def test_n_above_capacity_is_400_not_503(client):
    # capacity = --max-running (2) + --max-waiting (1) = 3
    err = _error(_post(client, "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "n": 4}), 400)
    assert err["param"] == "n" and "3" in err["message"]
    assert _post(client, "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "n": 3}).status_code == 200


def test_long_model_value_is_truncated_in_the_404(client):
    r = _post(client, "/v1/completions", {"prompt": "Hi", "model": "m" * 1_000_000})
    assert _error(r, 404)["code"] == "model_not_found" and len(r.content) < 1000


def test_openapi_documents_400_and_matches_validation(client):
    spec = client.get("/openapi.json").json()
    for path in ("/v1/chat/completions", "/v1/completions"):
        responses = spec["paths"][path]["post"]["responses"]
        assert "422" not in responses and "400" in responses
        assert "text/event-stream" in responses["200"]["content"]
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    top_k = spec["components"]["schemas"]["CompletionRequest"]["properties"]["top_k"]
    assert top_k["not"] == {"const": 0}
    err = _error(_post(client, "/v1/completions", {"prompt": "Hi", "top_k": 0}), 400)
    assert "top_k" in err["message"]
