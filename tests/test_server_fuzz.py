"""Thousands of malformed bodies against the app (in-process, real engine): never a 500, never a hang,
always an OpenAI-shaped error, and a valid request still works afterwards."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig

pytestmark = pytest.mark.timeout(300)

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens")
KEYS = (
    "model", "messages", "prompt", "tools", "tool_choice", "stream", "stream_options", "max_tokens",
    "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "logprobs", "top_logprobs",
    "chat_template_kwargs", "echo", "stop_token_ids", "ignore_eos",
    "system", "stop_sequences", "metadata", "thinking", "cache_control",  # Anthropic's
)  # fmt: skip

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
block_types = st.sampled_from(
    ["text", "tool_use", "tool_result", "thinking", "redacted_thinking", "image", "document", "x"]
)
anthropic_blocks = st.fixed_dictionaries(
    {"type": block_types},
    optional={k: json_values | st.text(max_size=8) for k in
              ("text", "id", "name", "input", "tool_use_id", "content", "is_error", "thinking", "cache_control")},
)  # fmt: skip
roles = st.sampled_from(["system", "user", "assistant", "tool", "developer", "bot", "", None])
messages = st.lists(
    st.fixed_dictionaries(
        {"role": roles},
        optional={
            "content": st.none()
            | st.text(max_size=30)
            | st.lists(st.dictionaries(st.sampled_from(["type", "text"]), json_values))
            | st.lists(anthropic_blocks, max_size=3),
            "tool_calls": json_values,
            "tool_call_id": st.text(max_size=5) | st.integers(),
            "reasoning_content": st.text(max_size=10) | st.integers(),
        },
    ),
    max_size=4,
)
tools = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["function", "fn"])},
        optional={
            "function": st.fixed_dictionaries(
                {"name": st.text(max_size=10)}, optional={"parameters": json_values}
            )
        },
    ),
    max_size=3,
)
# max_tokens is either tiny (so an accidentally valid body finishes at once) or invalid.
max_tokens = (
    st.just(2) | st.integers(max_value=0) | st.integers(min_value=10**5) | st.text(max_size=4) | st.floats()
)
# Anthropic's structured options, near-valid so validation is reached past the type checks
thinking = st.fixed_dictionaries(
    {"type": st.sampled_from(["enabled", "disabled", "adaptive", "on"])},
    optional={"budget_tokens": st.integers(-2, 4) | json_values},
)
tool_choice = st.fixed_dictionaries(
    {"type": st.sampled_from(["auto", "any", "tool", "none", "function"])},
    optional={"name": st.text(max_size=6) | json_values, "disable_parallel_tool_use": json_values},
)
bodies = st.fixed_dictionaries(
    {"max_tokens": max_tokens},
    optional={
        "messages": messages | json_values,
        "tools": tools | json_values,
        "prompt": json_values | st.text(max_size=20),
        "thinking": thinking | json_values,
        "tool_choice": tool_choice | json_values,
    }
    | {k: json_values for k in KEYS if k not in ("max_tokens", "messages", "tools", "prompt", "thinking",
                                                 "tool_choice")},
)  # fmt: skip


@pytest.fixture(scope="module")
def client():
    engine = Engine(None, kv_cache_memory="64M", max_model_len=256)
    aengine = AsyncEngine(engine)
    app = create_app(aengine, ServerConfig("smol", max_waiting=4), on_shutdown=aengine.shutdown)
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as c:
        yield c


def _check(resp, path: str = "", anthropic: bool = False) -> None:
    anthropic = anthropic or path.startswith("/v1/messages")
    assert resp.status_code < 500 or (resp.status_code == 529 and anthropic), resp.text
    if resp.status_code >= 400:
        body = resp.json()
        if anthropic:  # Anthropic's shape
            assert body["type"] == "error", body
        err = body["error"]
        assert isinstance(err["message"], str) and err["message"] and "type" in err


@settings(max_examples=1000, deadline=5000, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=64) | st.text(max_size=64).map(str.encode), path=st.sampled_from(ENDPOINTS))
def test_raw_garbage_bodies(client, raw, path):
    _check(client.post(path, content=raw, headers={"content-type": "application/json"}), path)


@settings(max_examples=1000, deadline=20000, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, path=st.sampled_from(ENDPOINTS))
def test_structured_malformed_bodies(client, body, path):
    if body.get("stream") is True:
        body["stream"] = False  # a streamed 200 is still checked below by the valid-request test
    _check(client.post(path, content=json.dumps(body), headers={"content-type": "application/json"}), path)


@settings(max_examples=300, deadline=5000, suppress_health_check=[HealthCheck.too_slow])
# "", "." and ".." are the list's own path once the URL is normalised, not a model id
@given(
    model_id=st.text(min_size=1, max_size=40).filter(lambda s: s.strip(".") != ""), anthropic=st.booleans()
)
def test_model_lookup(client, model_id, anthropic):
    headers = {"anthropic-version": "2023-06-01"} if anthropic else {}
    resp = client.get("/v1/models/" + quote(model_id, safe=""), headers=headers)
    _check(resp, anthropic=anthropic)
    if resp.status_code == 200:
        assert resp.json()["type" if anthropic else "object"] == "model"


def test_still_serves_and_no_pages_leak(client):
    ok = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0},
    )
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
    ok = client.post(
        "/v1/messages",
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0},
    )
    assert ok.status_code == 200 and ok.json()["usage"]["output_tokens"] >= 1
    kv = client.get("/debug/kv").json()
    assert kv["ok"] and kv["pages"]["request_pages"] == 0 and kv["in_flight"] == 0
