"""The Anthropic Messages API driven by the official ``anthropic`` SDK against the app in process
(real embedded model): text and tool use, streamed == non-streamed, count_tokens, each error type,
and a Claude Code-shaped session whose cache figures are checked against the engine's own counters."""

from __future__ import annotations

import json
import uuid

import anthropic
import pytest
from fastapi.testclient import TestClient

from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig

pytestmark = pytest.mark.timeout(600)
MODEL = "smol"
GREEDY = {"temperature": 0}  # the SDK dropped sampling arguments; the API still takes them


@pytest.fixture(scope="module")
def app():
    engine = Engine(None, kv_cache_memory="128M", max_model_len=4096)
    aengine = AsyncEngine(engine)
    app = create_app(
        aengine, ServerConfig(MODEL, api_keys={}, allowed_hosts=("testserver",)), on_shutdown=aengine.shutdown
    )
    with TestClient(app, raise_server_exceptions=False) as http:
        app.state.http = http
        yield app


@pytest.fixture(scope="module")
def client(app):
    return anthropic.Anthropic(base_url="http://testserver", api_key="none", http_client=app.state.http,
                               max_retries=0)  # fmt: skip


def _blocks(msg) -> list[dict]:
    return [{k: v for k, v in b.model_dump().items() if k not in ("id", "citations", "parsed_output")}
            for b in msg.content]  # fmt: skip


def _streamed(client, **kw):
    with client.messages.stream(**kw) as s:
        kinds = [e.type for e in s]
        return s.get_final_message(), kinds


def _prompt_len(u) -> int:
    return u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens


def test_text_streamed_equals_non_streamed(client):
    kw = dict(model=MODEL, max_tokens=12, messages=[{"role": "user", "content": "Name a fruit."}],
              extra_body=GREEDY)  # fmt: skip
    full = client.messages.create(**kw)
    streamed, kinds = _streamed(client, **kw)
    assert full.id.startswith("msg_") and full.role == "assistant" and full.type == "message"
    assert _blocks(full) == _blocks(streamed) and full.content[0].type == "text" and full.content[0].text
    assert (full.stop_reason, full.stop_sequence) == (streamed.stop_reason, streamed.stop_sequence)
    assert full.stop_reason in ("end_turn", "max_tokens")
    assert full.usage.output_tokens == streamed.usage.output_tokens <= 12
    assert _prompt_len(full.usage) == _prompt_len(streamed.usage)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    assert client.messages.count_tokens(model=MODEL, messages=kw["messages"]).input_tokens == _prompt_len(
        full.usage
    )


def test_raw_stream_event_sequence(app):
    body = {"model": MODEL, "max_tokens": 5, "stream": True, "temperature": 0,
            "messages": [{"role": "user", "content": "Hello"}]}  # fmt: skip
    text = app.state.http.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}).text
    names = [line[7:] for line in text.splitlines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}


def test_stop_sequence_reported(client):
    msgs = [{"role": "user", "content": "Count from one to ten in words."}]
    free = client.messages.create(model=MODEL, max_tokens=24, messages=msgs, extra_body=GREEDY)
    text = free.content[0].text
    words = text.split()
    assert len(words) >= 3, text
    stop = words[len(words) // 2]
    got = client.messages.create(model=MODEL, max_tokens=24, messages=msgs, stop_sequences=[stop],
                                 extra_body=GREEDY)  # fmt: skip
    assert got.stop_reason == "stop_sequence" and got.stop_sequence == stop
    assert got.content[0].text == text[: text.index(stop)]


TOOLS = [
    {"name": f"tool_{i}", "description": f"Tool number {i}: looks up fact {i} about a city.",
     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    for i in range(16)
]  # fmt: skip


def test_three_turn_tool_use_loop(client):
    # A 135M model needs the call's shape shown once; the template's tool prompt alone is not enough.
    shape = '<tool_call>\n{"name": "tool_3", "arguments": {"city": "Paris"}}\n</tool_call>'
    msgs: list[dict] = [{"role": "user", "content": f"Call tool_3 for Paris. The call looks like {shape}"}]
    tools = TOOLS[:4]
    for turn in range(2):  # one call a turn: a forced choice with parallel calls allowed may make several
        kw = dict(model=MODEL, max_tokens=40, messages=msgs, tools=tools,
                  tool_choice={"type": "tool", "name": "tool_3", "disable_parallel_tool_use": True},
                  extra_body=GREEDY)  # fmt: skip
        full = client.messages.create(**kw)
        streamed, _ = _streamed(client, **kw)
        assert full.stop_reason == "tool_use" == streamed.stop_reason, full
        use = full.content[-1]
        assert use.type == "tool_use" and use.name == "tool_3" and use.id.startswith("toolu_")
        assert isinstance(use.input, dict)
        assert _blocks(full) == _blocks(streamed)
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in full.content]})
        msgs.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id, "content": json.dumps({"fact": turn})}]})  # fmt: skip
    answer = client.messages.create(model=MODEL, max_tokens=10, messages=msgs, tools=tools,
                                    tool_choice={"type": "none"}, extra_body=GREEDY)  # fmt: skip
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.content[0].type == "text"
    assert answer.usage.cache_read_input_tokens > 0.5 * _prompt_len(answer.usage)


def _claude_code_request(nonce: str, msgs: list[dict], **extra) -> dict:
    system = [
        {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.0; cch={nonce};"},
        {"type": "text", "text": "You are Claude Code, an interactive CLI agent. " * 4},
        {"type": "text", "text": "Rules: be brief, use tools, never guess file contents. " * 6,
         "cache_control": {"type": "ephemeral", "ttl": "1h"}},
    ]  # fmt: skip
    return {"model": "claude-local-agent", "max_tokens": 4, "system": system, "messages": msgs, "tools": TOOLS,
            "extra_body": GREEDY, **extra}  # fmt: skip


def test_claude_code_session_reads_the_cache(app, client):
    engine = app.state.kv.engine
    # other tests' breakpoints (5-minute ones too): only those this session pinned or refreshed count
    earlier = {p.owner: p.ttl_left for p in engine.cache.pins.info()}
    msgs: list[dict] = [{"role": "user", "content": "Fix the failing test in the repo."}]
    for turn in range(8):
        before = engine.stats()
        msg = client.messages.create(**_claude_code_request(uuid.uuid4().hex[:5], msgs))
        after = engine.stats()
        u = msg.usage
        seen = after.prompt_tokens - before.prompt_tokens  # the engine's own counters, not the usage code's
        assert (
            _prompt_len(u) == seen and u.cache_read_input_tokens == after.cached_tokens - before.cached_tokens
        )
        if turn >= 1:
            assert u.cache_read_input_tokens >= 0.9 * seen, (turn, u)
        assert msg.model == "claude-local-agent"
        call = {"type": "tool_use", "id": f"toolu_{turn:02d}", "name": f"tool_{turn % 16}",
                "input": {"city": f"file_{turn}.py"}}  # fmt: skip
        msgs.append({"role": "assistant", "content": [call]})
        msgs.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call["id"], "content": f"contents of file {turn}"}]})  # fmt: skip
    pins = [p for p in engine.cache.pins.info()
            if p.owner[1:2] == ("breakpoint",) and p.ttl_left > earlier.get(p.owner, -1.0)]  # fmt: skip
    assert pins and all(p.ttl_left > 3000 for p in pins)  # the 1h system breakpoint


def test_cache_control_never_changes_the_output(client):
    msgs = [{"role": "user", "content": "Which file holds the tests?"}]
    marked = _claude_code_request("ccccc", msgs, cache_control={"type": "ephemeral"}, max_tokens=12)
    plain = _claude_code_request("ccccc", msgs, max_tokens=12)
    plain["system"] = [{k: v for k, v in b.items() if k != "cache_control"} for b in plain["system"]]
    a, b = client.messages.create(**marked), client.messages.create(**plain)
    assert _blocks(a) == _blocks(b) and a.stop_reason == b.stop_reason
    assert [p["pinned"] for p in a.model_extra["kvreuse"]["cache_control"]] == [True, True]
    assert b.model_extra["kvreuse"]["cache_control"] == []


def test_kept_nonce_is_named_by_diagnostics(app, client):
    state = app.state.kv
    state.config.keep_billing_header = True
    try:
        msgs = [{"role": "user", "content": "List the files."}]
        client.messages.create(**_claude_code_request("aaaaa", msgs))
        second = client.messages.create(**_claude_code_request("bbbbb", msgs))
    finally:
        state.config.keep_billing_header = False
    cache = second.model_extra["kvreuse"]["cache"]
    assert cache["cause"] == "system_changed" and cache["system_block"]["index"] == 0
    assert cache["system_block"]["billing_header"] is True and "billing-header" in cache["detail"]
    assert second.usage.cache_read_input_tokens < 32  # the nonce breaks the prefix near token 0


def test_metadata_user_id_is_the_session(app, client):
    client.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "Hi there, tell me a story. " * 8}],
                           metadata={"user_id": "agent-7"}, extra_body=GREEDY)  # fmt: skip
    assert (None, "agent-7") in app.state.kv.engine.cache.pins


def test_error_types(app, client):
    ok = [{"role": "user", "content": "Hi"}]
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.messages.create(model=MODEL, messages=ok, max_tokens=0)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    with pytest.raises(anthropic.BadRequestError, match="image blocks are not supported"):
        client.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [image]}])
    with pytest.raises(anthropic.BadRequestError, match="tool_use_id"):
        client.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_none", "content": "x"}]}])  # fmt: skip
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="gpt-4o", max_tokens=2, messages=ok)
    http = app.state.http
    big = http.post(
        "/v1/messages", content=b"x" * (32 * 2**20 + 1), headers={"content-type": "application/json"}
    )
    assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"  # the RequestGuard
    state = app.state.kv
    state.in_flight += state.capacity
    try:
        with pytest.raises(anthropic.OverloadedError):
            client.messages.create(model=MODEL, max_tokens=2, messages=ok)
    finally:
        state.in_flight -= state.capacity
    state.tenants.keys = {"sk-good": "team"}
    try:
        with pytest.raises(anthropic.AuthenticationError):
            client.messages.create(model=MODEL, max_tokens=2, messages=ok)
        keyed = anthropic.Anthropic(base_url="http://testserver", api_key="sk-good", http_client=http,
                                    max_retries=0)  # fmt: skip
        assert keyed.messages.create(model=MODEL, max_tokens=2, messages=ok, extra_body=GREEDY).content
        bearer = anthropic.Anthropic(base_url="http://testserver", auth_token="sk-good", http_client=http,
                                     max_retries=0)  # fmt: skip
        assert bearer.messages.count_tokens(model=MODEL, messages=ok).input_tokens > 0
    finally:
        state.tenants.keys = {}


def test_models_in_anthropic_shape(client):
    page = client.models.list()
    assert [m.id for m in page.data] == [MODEL] and page.data[0].type == "model"


def test_error_mid_stream_is_an_error_event(app, monkeypatch):
    from kvreuse.runtime.server.anthropic import messages

    async def boom(self):
        raise RuntimeError("the pin table went away")

    monkeypatch.setattr(messages.MessagesRun, "pin_breakpoints", boom)
    body = {"model": MODEL, "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    text = app.state.http.post("/v1/messages", json=body).text
    names = [line[7:] for line in text.splitlines() if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-1] == "error" and "message_stop" not in names
    last = json.loads(text.strip().splitlines()[-1][6:])
    assert (
        last["type"] == "error"
        and last["error"]["type"] == "api_error"
        and "pin table" in last["error"]["message"]
    )
    assert app.state.kv.in_flight == 0
