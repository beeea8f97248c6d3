"""Issue 39 against the in-process app (the embedded engine): no 500 from a body or schema, cache_control
capped, operator-only routes, ``/v1/cache`` of the caller's own, grammar compiles under a budget and
per tenant, ``/health`` that never waits and sees a stalled loop, no normal finish for invalid output."""

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

KEYS = {"key-a": "a", "key-b": "b", "key-op": "@operator"}
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def engine():
    aengine = AsyncEngine(Engine(None, kv_cache_memory="64M", max_model_len=256, max_running=4))
    yield aengine
    aengine.shutdown()


def _client(aengine, **config) -> TestClient:
    return TestClient(create_app(aengine, ServerConfig("smol", **config)), base_url="http://127.0.0.1",
                      raise_server_exceptions=False)  # fmt: skip


@pytest.fixture(scope="module")
def client(engine):
    with _client(engine, api_keys=KEYS) as c:
        yield c


def _post(c, path: str, body, key: str = "key-a", **headers):
    content = body if isinstance(body, str) else json.dumps(body)
    h = {"content-type": "application/json", "authorization": f"Bearer {key}", **headers}
    return c.post(path, content=content, headers=h)


def _anthropic(c, path: str, body, key: str = "key-a"):
    return _post(c, path, body, key, **{"anthropic-version": "2023-06-01"})


def _openai_400(r) -> str:
    assert r.status_code == 400, (r.status_code, r.text[:300])
    return r.json()["error"]["message"]


def _anthropic_400(r) -> str:
    assert r.status_code == 400, (r.status_code, r.text[:300])
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    return body["error"]["message"]


# -- 7. the 500s ------------------------------------------------------------------------------------
DEEP = "[" * 100_000 + "]" * 100_000


def test_deeply_nested_bodies_are_400s_in_each_protocols_shape(client):
    assert "nested deeper" in _openai_400(_post(client, "/v1/chat/completions", DEEP))
    assert "nested deeper" in _openai_400(_post(client, "/v1/cache/prewarm", DEEP))
    deep_field = '{"messages": ' + DEEP + "}"
    assert "nested deeper" in _openai_400(_post(client, "/v1/chat/completions", deep_field))
    assert "nested deeper" in _anthropic_400(_anthropic(client, "/v1/messages", DEEP))
    assert "nested deeper" in _anthropic_400(_anthropic(client, "/v1/messages/count_tokens", DEEP))


def test_tool_use_input_nested_2000_deep_is_a_400(client):
    call = {"type": "tool_use", "id": "t1", "name": "f", "input": "NESTED"}
    body = {"model": "claude-x", "max_tokens": 1, "messages": [
        {"role": "user", "content": "go"}, {"role": "assistant", "content": [call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]}  # fmt: skip
    body = json.dumps(body).replace('"NESTED"', '{"a": ' * 2000 + "{}" + "}" * 2000)  # json.dumps recurses
    _anthropic_400(_anthropic(client, "/v1/messages", body))
    _anthropic_400(_anthropic(client, "/v1/messages/count_tokens", body))


def _schema_chat(schema) -> dict:
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    return {"messages": HI, "max_tokens": 2, "response_format": fmt}


@pytest.mark.parametrize(
    "schema",
    [
        "any_of_400",
        {"type": "object", "properties": {"a": {"type": "string"}}, "x-guidance": "x"},
        {"anyOf": [{"type": "object", "properties": "nope"}]},
        {"allOf": [{"type": "object", "properties": [1, 2]}]},
        {"type": "object", "properties": {"a": {"anyOf": [{"properties": 3}]}}},
    ],
)
def test_schemas_the_grammar_cannot_take_are_400s(client, schema):
    if schema == "any_of_400":
        schema = {"type": "string"}
        for _ in range(400):
            schema = {"anyOf": [schema, {"type": "null"}]}
    _openai_400(_post(client, "/v1/chat/completions", _schema_chat(schema)))


# -- 3. cache_control breakpoints ----------------------------------------------------------------
def test_more_than_four_cache_control_blocks_is_anthropics_400(client):
    mark = {"type": "ephemeral"}
    blocks = [{"type": "text", "text": f"part {i}", "cache_control": mark} for i in range(5)]
    body = {"model": "claude-x", "max_tokens": 1, "messages": [{"role": "user", "content": blocks}]}
    msg = _anthropic_400(_anthropic(client, "/v1/messages", body))
    assert msg == "A maximum of 4 blocks with cache_control may be provided. Found 5."
    body["messages"][0]["content"] = blocks[:4]
    assert _anthropic(client, "/v1/messages", body).status_code == 200


# -- 5. operator routes and the caller's own cache figures ---------------------------------------
@pytest.mark.parametrize("path", ["/metrics", "/debug/kv", "/docs", "/openapi.json", "/redoc"])
def test_operator_routes_need_the_operator_key(client, path):
    h = lambda key: {"authorization": f"Bearer {key}"}  # noqa: E731
    r = client.get(path, headers=h("key-b"))
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    assert client.get(path).status_code == 401
    assert client.get(path, headers=h("key-op")).status_code == 200


def test_cache_reset_is_the_operators(client):
    assert _post(client, "/v1/cache/reset", {}, key="key-b").status_code == 403
    assert _post(client, "/v1/cache/reset", {}, key="key-op").status_code == 200


def test_v1_cache_shows_only_the_callers_own_pages_and_pins(client):
    def view(key: str) -> dict:
        r = client.get("/v1/cache", headers={"authorization": f"Bearer {key}"})
        assert r.status_code == 200
        return r.json()

    before = view("key-b")
    text = " ".join(f"word{i}" for i in range(60))
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 2, "user": "sess-a"}
    assert _post(client, "/v1/chat/completions", body, key="key-a").status_code == 200
    after = view("key-b")
    assert after == before  # nothing of A's traffic moves B's view (old: pages +13, pins +1)
    assert set(after["pages"]) == {"total", "pinned"} and after["pages"]["pinned"] == 0
    mine = view("key-a")
    assert mine["pages"]["pinned"] > 0 and [s["id"] for s in mine["sessions"]] == ["sess-a"]


# -- 2. grammar compiles: a budget, per tenant, never in the way of /health ----------------------
def _big_schema(n: int, salt: str) -> dict:
    return {"type": "object", "properties": {f"{salt}{i}": {"type": "string"} for i in range(n)}}


def test_a_compile_over_its_budget_is_a_400_naming_the_schema_and_others_go_on(client, engine):
    grammars = engine.engine.admission.grammars
    old = grammars.timeout_s, grammars.per_tenant
    grammars.timeout_s, grammars.per_tenant = 0.5, 1
    try:
        _post(client, "/v1/chat/completions", _schema_chat({"type": "object"}), key="key-a")  # llg tokenizer
        slow: dict = {}

        def b_sends_a_slow_schema():
            t0 = time.monotonic()
            slow["r"] = _post(
                client, "/v1/chat/completions", _schema_chat(_big_schema(6000, "p")), key="key-b"
            )
            slow["s"] = time.monotonic() - t0

        t = threading.Thread(target=b_sends_a_slow_schema)
        t.start()
        time.sleep(0.1)
        worst = 0.0
        while t.is_alive():  # /health never waits on the compile
            t0 = time.monotonic()
            assert client.get("/health").status_code == 200
            worst = max(worst, time.monotonic() - t0)
        # B's compile of 6000 properties still runs (seconds, several budgets here): B may not
        # start another one (one core at most), A still may.  Asked at once, before A's request, so a
        # faster machine still finds it running.
        busy = _post(client, "/v1/chat/completions", _schema_chat(_big_schema(10, "r")), key="key-b")
        t0 = time.monotonic()  # A's new schema compiles while B's abandoned compile still runs
        r = _post(client, "/v1/chat/completions", _schema_chat(_big_schema(20, "q")), key="key-a")
        a_s = time.monotonic() - t0
        t.join()
        msg = _openai_400(slow["r"])
        assert msg.startswith("json_schema") and "longer than 0.5 s" in msg, msg
        assert slow["s"] < 5, slow["s"]  # refused at the budget, not after the compile (seconds)
        assert r.status_code == 200 and a_s < 5, (r.text, a_s)
        assert worst < 0.5, worst
        assert busy.status_code == 429 and busy.json()["error"]["code"] == "grammar_busy", busy.text
    finally:
        grammars.timeout_s, grammars.per_tenant = old


def test_the_grammar_cache_is_per_tenant(client, engine):
    grammars = engine.engine.admission.grammars
    deadline = time.monotonic() + 120  # an earlier test's abandoned compile would count when it lands
    while grammars.in_flight() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert grammars.in_flight() == 0
    schema = _schema_chat(_big_schema(30, "shared"))
    assert _post(client, "/v1/chat/completions", schema, key="key-a").status_code == 200
    n = grammars.compiles
    assert _post(client, "/v1/chat/completions", schema, key="key-a").status_code == 200
    assert grammars.compiles == n  # A's own second request hits A's cache
    assert _post(client, "/v1/chat/completions", schema, key="key-op").status_code == 200
    assert grammars.compiles == n + 1  # another tenant compiles its own: a hit would tell it A sent it


# -- 8. size refusals before the render ----------------------------------------------------------
def test_content_longer_than_any_context_is_refused_before_tokenising(client):
    big = "a" * (4 << 20)
    t0 = time.monotonic()
    body = {"messages": [{"role": "user", "content": big}], "max_tokens": 1}
    r = _post(client, "/v1/chat/completions", body, key="key-a")
    assert r.status_code in (400, 413) and time.monotonic() - t0 < 10, r.text[:200]
    body = {"model": "claude-x", "max_tokens": 1, "messages": [{"role": "user", "content": big}]}
    t0 = time.monotonic()
    r = _anthropic(client, "/v1/messages/count_tokens", body)
    assert r.status_code in (400, 413) and time.monotonic() - t0 < 10, r.text[:200]


def test_count_tokens_renders_off_the_event_loop(client):
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(240)]
    body = {"model": "claude-x", "messages": msgs}
    done = threading.Event()

    def count():
        for _ in range(5):
            assert _anthropic(client, "/v1/messages/count_tokens", body).status_code in (200, 400)
        done.set()

    threading.Thread(target=count).start()
    worst = 0.0
    while not done.is_set():
        t0 = time.monotonic()
        client.get("/health")
        worst = max(worst, time.monotonic() - t0)
    assert worst < 0.5, worst


# -- 2. a stalled engine loop is unhealthy ------------------------------------------------------
def test_health_reports_a_stalled_engine_loop(engine):
    with _client(engine, health_stall_s=0.5) as c:
        assert c.get("/health").status_code == 200
        t = threading.Thread(target=lambda: engine.run_idle(lambda e: time.sleep(2.0)))
        t.start()
        time.sleep(1.0)
        r = c.get("/health")
        t.join()
        assert r.status_code == 503 and r.json()["status"] == "stalled", r.text
        time.sleep(0.2)
        assert c.get("/health").status_code == 200


# -- 6. invalid output is never a normal finish --------------------------------------------------
@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "^a{1000000}$"},
        {"$ref": "#", "type": "object"},
        {"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]},
    ],
)
def test_output_that_stops_short_of_the_schema_is_not_a_normal_stop(client, schema):
    import jsonschema

    body = {**_schema_chat(schema), "max_tokens": 24, "temperature": 0}
    r = _post(client, "/v1/chat/completions", body, key="key-a")
    if r.status_code == 400:
        return  # refused up front: allowed
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    else:
        assert choice["finish_reason"] in ("length", "grammar_error"), choice


HOSTILE = [
    {"type": "string", "pattern": "^a{1000000}$"},
    {"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]},
    {"$ref": "#/$defs/n", "$defs": {"n": {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}},
                                          "required": ["a"]}}},
]  # fmt: skip


@pytest.mark.parametrize("schema", HOSTILE)
def test_a_schema_no_output_can_satisfy_is_a_400_at_compile_time(client, schema):
    """Issue 51 row 9: both compiled and ran, answering 200 with ``{"`` and ``grammar_error``."""
    chat = _post(client, "/v1/chat/completions", {**_schema_chat(schema), "max_tokens": 24}, key="key-b")
    assert "no output valid against it" in _openai_400(chat)
    fmt = {"type": "json_schema", "name": "x", "schema": schema}
    body = {"model": "smol", "input": "Hi", "max_output_tokens": 24, "text": {"format": fmt}}
    resp = _post(client, "/v1/responses", body, key="key-b")
    assert "no output valid against it" in _openai_400(resp)
    fine = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    ok = _post(client, "/v1/chat/completions", {**_schema_chat(fine), "max_tokens": 24, "temperature": 0})
    assert ok.status_code == 200, ok.text


def test_a_grammar_that_errors_stops_the_request_as_grammar_error(engine):
    """The stop decision itself (``Request.stop_reason``), with a real llguidance matcher put in error
    by a token its grammar rejects (what a schema past llguidance's limits does mid-generation)."""
    from kvreuse.runtime.sampling.constrained import json_object
    from kvreuse.runtime.sampling.params import SamplingParams

    eng = engine.engine
    req = eng.make_request("Hi", SamplingParams(max_tokens=8, grammar=json_object()))
    bad = eng.tokenizer.encode("abc", add_special_tokens=False)[0]  # a JSON object cannot start so
    assert not req.matcher.advance(bad) and req.matcher.error is not None
    req.tokens.append(bad)
    assert req.stop_reason(bad) == "grammar_error"  # old: the forced EOS that followed read as "stop"


def test_concurrent_requests_with_one_new_grammar_compile_it_once(engine):
    from concurrent.futures import ThreadPoolExecutor

    from kvreuse.runtime.sampling.constrained import json_schema

    grammars = engine.engine.admission.grammars
    g = json_schema(_big_schema(40, "concurrent"))
    n = grammars.compiles
    with ThreadPoolExecutor(8) as pool:  # one compile slot per tenant would 429 seven of them
        got = list(pool.map(lambda _: grammars.compiled(g, "t"), range(8)))
    assert all(m is got[0] for m in got) and grammars.compiles == n + 1
