"""Anthropic request -> the chat core's request: blocks, the nonce, breakpoints, tool choice (no engine)."""

from __future__ import annotations

import pytest

from kvreuse.runtime.server.anthropic.convert import NONCE_PREFIX, convert
from kvreuse.runtime.server.anthropic.messages import message_params
from kvreuse.runtime.server.anthropic.protocol import MessagesRequest
from kvreuse.runtime.server.errors import APIError

TOOL = {"name": "read", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
        "cache_control": {"type": "ephemeral"}}  # fmt: skip


def _req(**kw) -> MessagesRequest:
    return MessagesRequest.model_validate({"max_tokens": 8, **kw})


def test_blocks_become_chat_messages():
    req = _req(
        system=[{"type": "text", "text": NONCE_PREFIX + " cch=123;"}, {"type": "text", "text": "Be brief."},
                {"type": "text", "text": "Use tools.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        tools=[TOOL], tool_choice={"type": "any"},
        messages=[
            {"role": "user", "content": "read a"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "need a", "signature": "sig"},
                {"type": "redacted_thinking", "data": "xx"},
                {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "no"}],
                 "is_error": True},
                {"type": "text", "text": "again", "cache_control": {"type": "ephemeral"}}]},
        ],
        metadata={"user_id": "u1"}, stop_sequences=["END"], thinking={"type": "disabled"},
    )  # fmt: skip
    conv = convert(req)
    msgs = [{k: v for k, v in m.items() if v is not None} for m in conv.chat.messages]
    assert msgs[0] == {"role": "system", "content": "Be brief.\n\nUse tools."} and conv.dropped_nonce
    assert msgs[2]["reasoning_content"] == "need a" and "content" not in msgs[2]  # tool calls only
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "read", "arguments": '{"path": "a"}'}
    assert msgs[3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: no"}
    assert msgs[4] == {"role": "user", "content": "again"}
    assert [(b.message, b.ttl) for b in conv.breakpoints] == [(0, 3600.0), (4, 300.0), ("tools", 300.0)]
    c = conv.chat
    assert c.tool_choice == "required" and c.tool_name is None
    assert c.template_kwargs == {"enable_thinking": False} and c.reasoning_budget is None
    params = message_params(req, None)(100, 0)
    assert (params.stop, params.max_tokens, params.temperature) == (["END"], 8, 1.0)
    kept = convert(req, keep_nonce=True)
    assert kept.chat.messages[0]["content"].startswith(NONCE_PREFIX) and kept.system_blocks[0].nonce


@pytest.mark.parametrize(
    "content, needle",
    [
        ([{"type": "image", "source": {}}], "image blocks are not supported"),
        ([{"type": "document", "source": {}}], "document blocks are not supported"),
        ([{"type": "tool_result", "tool_use_id": "toolu_x", "content": "r"}], "no earlier tool_use"),
    ],
)
def test_refused_content(content, needle):
    with pytest.raises(APIError, match=needle) as e:
        convert(_req(messages=[{"role": "user", "content": content}]))
    assert e.value.status == 400


def test_named_tool_choice_must_be_a_tool():
    with pytest.raises(ValueError, match="not in tools"):
        _req(
            messages=[{"role": "user", "content": "x"}],
            tools=[TOOL],
            tool_choice={"type": "tool", "name": "w"},
        )
    conv = convert(_req(messages=[{"role": "user", "content": "x"}], tools=[TOOL],
                        tool_choice={"type": "tool", "name": "read"}))  # fmt: skip
    assert (conv.chat.tool_choice, conv.chat.tool_name) == ("tool", "read")


def test_thinking_budget_and_its_rules():
    ok = [{"role": "user", "content": "x"}]
    conv = convert(_req(messages=ok, max_tokens=64, thinking={"type": "enabled", "budget_tokens": 16}))
    assert conv.chat.template_kwargs == {"enable_thinking": True} and conv.chat.reasoning_budget == 16
    for bad, needle in [
        ({"thinking": {"type": "enabled"}}, "needs budget_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 8}}, "greater than thinking.budget_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 4}, "tools": [TOOL], "tool_choice": {"type": "any"}},
         "forces tool use"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=needle):
            _req(messages=ok, **bad)
