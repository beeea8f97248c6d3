"""Issue 56: ``max_tokens`` beyond the room a prompt leaves is clamped to it (llama.cpp's behaviour,
so agents that always ask for 32000 work), reported in usage; ``--max-tokens-overflow refuse`` keeps
the 400.  And ``GET /v1/responses/{id}/input_items`` lists a stored response's input.

In-process app on the embedded engine with a 256-token context: the room left is 256 - the prompt's
tokens, where the prompt's size comes from the response's own usage (and input_tokens counting)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig

pytestmark = pytest.mark.timeout(300)

MAX_LEN = 256
ASK = 32000  # what Claude Code always asks for


@pytest.fixture(scope="module")
def engine():
    aengine = AsyncEngine(Engine(None, kv_cache_memory="64M", max_model_len=MAX_LEN, max_running=2))
    yield aengine
    aengine.shutdown()


def _client(aengine: AsyncEngine, **config) -> TestClient:
    app = create_app(aengine, ServerConfig("smol", **config))
    return TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False)


@pytest.fixture(scope="module")
def clamp(engine):
    with _client(engine) as c:
        yield c


@pytest.fixture(scope="module")
def refuse(engine):
    with _client(engine, max_tokens_overflow="refuse") as c:
        yield c


def _post(client, path: str, body: dict, **headers):
    return client.post(
        path, content=json.dumps(body), headers={"content-type": "application/json", **headers}
    )


MESSAGES = [{"role": "user", "content": "Say hello."}]


def test_anthropic_max_tokens_32000_is_clamped_to_the_room_left(clamp):
    body = {"model": "claude-sonnet-4-5", "max_tokens": ASK, "messages": MESSAGES, "temperature": 0}
    r = _post(clamp, "/v1/messages", body)
    assert r.status_code == 200, r.text
    u = r.json()["usage"]
    prompt = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
    counted = _post(clamp, "/v1/messages/count_tokens", {k: body[k] for k in ("model", "messages")}).json()
    assert counted["input_tokens"] == prompt  # the prompt's size from an independent route
    assert u["max_tokens_clamped"] == {"asked": ASK, "granted": MAX_LEN - prompt}
    assert u["output_tokens"] <= MAX_LEN - prompt
    assert r.json()["kvreuse"]["max_tokens_clamped"] == u["max_tokens_clamped"]


def test_chat_completions_and_responses_clamp_too_and_a_fitting_request_is_untouched(clamp):
    r = _post(clamp, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": ASK, "temperature": 0})
    assert r.status_code == 200, r.text
    u = r.json()["usage"]
    assert u["max_tokens_clamped"] == {"asked": ASK, "granted": MAX_LEN - u["prompt_tokens"]}
    r = _post(clamp, "/v1/responses", {"input": "Say hello.", "max_output_tokens": ASK, "temperature": 0})
    assert r.status_code == 200, r.text
    u = r.json()["usage"]
    assert u["max_tokens_clamped"] == {"asked": ASK, "granted": MAX_LEN - u["input_tokens"]}
    r = _post(clamp, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3})
    assert r.status_code == 200 and "max_tokens_clamped" not in r.json()["usage"]


def test_refuse_keeps_the_400_in_each_protocols_shape(refuse):
    body = {"model": "claude-sonnet-4-5", "max_tokens": ASK, "messages": MESSAGES}
    r = _post(refuse, "/v1/messages", body)
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert "exceeds the model's context length (256 tokens)" in r.json()["error"]["message"]
    r = _post(refuse, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": ASK})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_a_prompt_that_does_not_fit_is_refused_even_when_clamping(clamp):
    r = _post(
        clamp,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "word " * 400}], "max_tokens": ASK},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_input_items_lists_a_stored_responses_input(clamp):
    items = [{"type": "message", "role": "user", "content": "One."},
             {"type": "message", "role": "assistant", "content": "Two."},
             {"type": "message", "role": "user", "content": "Three."}]  # fmt: skip
    r = _post(clamp, "/v1/responses", {"input": items, "max_output_tokens": 2})
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    got = clamp.get(f"/v1/responses/{rid}/input_items").json()
    assert got["object"] == "list" and not got["has_more"]
    assert [d["content"] for d in got["data"]] == ["Three.", "Two.", "One."]  # desc by default, as OpenAI's
    assert got["first_id"] == got["data"][0]["id"] and all(d["id"].startswith("msg_") for d in got["data"])
    asc = clamp.get(f"/v1/responses/{rid}/input_items", params={"order": "asc", "limit": 1}).json()
    assert [d["content"] for d in asc["data"]] == ["One."] and asc["has_more"]
    nxt = clamp.get(
        f"/v1/responses/{rid}/input_items", params={"order": "asc", "after": asc["last_id"]}
    ).json()
    assert [d["content"] for d in nxt["data"]] == ["Two.", "Three."] and not nxt["has_more"]
    s = clamp.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 1}).json()
    one = clamp.get(f"/v1/responses/{s['id']}/input_items").json()["data"]
    assert one[0]["content"] == [{"type": "input_text", "text": "Hi"}] and one[0]["role"] == "user"
    assert clamp.get("/v1/responses/resp_nope/input_items").status_code == 404
    assert clamp.get(f"/v1/responses/{rid}/input_items", params={"limit": 0}).status_code == 400


@pytest.fixture(scope="module")
def capped(engine):
    with _client(engine, max_tokens_cap=5) as c:
        yield c


def test_a_server_cap_bounds_every_request_and_says_so(capped):
    """``--max-tokens-cap`` (llama.cpp's server --n-predict): asking more gets the cap, reported with
    ``by: cap``; asking less is untouched; a room smaller than the cap is still the room's clamp."""
    r = _post(capped, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": ASK, "temperature": 0})
    assert r.status_code == 200, r.text
    u = r.json()["usage"]
    assert u["max_tokens_clamped"] == {"asked": ASK, "granted": 5, "by": "cap"}
    assert u["completion_tokens"] <= 5
    body = {"model": "claude-sonnet-4-5", "max_tokens": ASK, "messages": MESSAGES, "temperature": 0}
    r = _post(capped, "/v1/messages", body)
    assert r.status_code == 200 and r.json()["usage"]["max_tokens_clamped"]["by"] == "cap", r.text
    assert r.json()["usage"]["output_tokens"] <= 5
    r = _post(capped, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3})
    assert r.status_code == 200 and "max_tokens_clamped" not in r.json()["usage"]
    long = [{"role": "user", "content": "word " * 243}]
    r = _post(capped, "/v1/chat/completions", {"messages": long, "max_tokens": ASK})
    assert r.status_code == 200, r.text
    u = r.json()["usage"]
    room = MAX_LEN - u["prompt_tokens"]
    assert room < 5 and u["max_tokens_clamped"] == {"asked": ASK, "granted": room}
