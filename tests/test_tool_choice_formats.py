"""A forced tool choice on a template whose tool-call format has no grammar (Qwen3.5's XML calls) is a
clear 400 naming ``tool_choice``, on both protocols, not a server error; ``auto`` still serves."""

from __future__ import annotations

import anthropic
import openai
import pytest
from fastapi.testclient import TestClient

from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig

TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}  # fmt: skip
MSGS = [{"role": "user", "content": "Look up 'kv'."}]


@pytest.fixture(scope="module")
def http():
    aengine = AsyncEngine(Engine(None, kv_cache_memory="32M", max_model_len=2048))
    config = ServerConfig("smol", allowed_hosts=("testserver",), chat_template="qwen3_5")
    app = create_app(aengine, config, on_shutdown=aengine.shutdown)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def test_forced_choice_without_a_grammar_is_a_400(http):
    oa = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
    for choice in ("required", {"type": "function", "function": {"name": "lookup"}}):
        with pytest.raises(openai.BadRequestError) as e:
            oa.chat.completions.create(
                model="smol", messages=MSGS, tools=[TOOL], tool_choice=choice, max_tokens=4
            )
        assert e.value.body["param"] == "tool_choice" and "qwen_xml" in e.value.body["message"]
    ok = oa.chat.completions.create(
        model="smol", messages=MSGS, tools=[TOOL], tool_choice="auto", max_tokens=4
    )
    assert ok.choices[0].finish_reason in ("stop", "length", "tool_calls")

    an = anthropic.Anthropic(base_url="http://testserver", api_key="none", http_client=http, max_retries=0)
    tool = {
        "name": "lookup",
        "description": "Look a word up.",
        "input_schema": TOOL["function"]["parameters"],
    }
    with pytest.raises(anthropic.BadRequestError) as e:
        an.messages.create(
            model="smol", max_tokens=4, messages=MSGS, tools=[tool], tool_choice={"type": "any"}
        )
    assert (
        e.value.body["error"]["type"] == "invalid_request_error"
        and "qwen_xml" in e.value.body["error"]["message"]
    )
