"""Parallel-call controls on a real ``kvreuse serve`` (the embedded model), issue 35: ``parallel_tool_calls``
false on chat completions and Responses and Anthropic's ``disable_parallel_tool_use`` give one call
(under ``tool_choice`` auto too); allowed, a forced choice gives several; and a forced call cut by
``max_tokens`` comes back the same streamed or not.  The grammar side per tool format:
``test_single_call_grammar.py``."""

from __future__ import annotations

import json

import anthropic
import pytest

from tests.test_responses_api import MODEL, TOOLS, WEATHER, _calls, _create
from tests.test_responses_api import client as client  # the same server setup, its own instance
from tests.test_responses_api import server as server

pytestmark = pytest.mark.timeout(600)


# -- parallel-call controls -------------------------------------------------------------------------
def _shot_call(i: int, city: str) -> dict:
    return {
        "id": f"c{i}",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
    }


# two earlier turns in which the assistant called the tool once per city: the model then makes two
# calls for two cities under tool_choice auto, unless the grammar allows only one
SHOTS = [
    {"role": "system", "content": "You only answer with tool calls, one per city."},
    {"role": "user", "content": "Weather in Lima and Cairo?"},
    {"role": "assistant", "content": None, "tool_calls": [_shot_call(1, "Lima"), _shot_call(2, "Cairo")]},
    {"role": "tool", "tool_call_id": "c1", "content": "12C"},
    {"role": "tool", "tool_call_id": "c2", "content": "30C"},
    {"role": "assistant", "content": "Lima 12C, Cairo 30C."},
    {"role": "user", "content": "Weather in Berlin and Madrid?"},
    {"role": "assistant", "content": None, "tool_calls": [_shot_call(3, "Berlin"), _shot_call(4, "Madrid")]},
    {"role": "tool", "tool_call_id": "c3", "content": "8C"},
    {"role": "tool", "tool_call_id": "c4", "content": "20C"},
    {"role": "assistant", "content": "Berlin 8C, Madrid 20C."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
]
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city.",
                                                "parameters": WEATHER}}]  # fmt: skip


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_chat_parallel_tool_calls_false_gives_one_call(client, choice):
    kwargs = dict(
        model=MODEL, messages=SHOTS, tools=CHAT_TOOLS, tool_choice=choice, max_tokens=80, temperature=0
    )
    allowed = client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    single = client.chat.completions.create(**kwargs, parallel_tool_calls=False).choices[0].message.tool_calls
    assert len(allowed) == 2 and len(single) == 1, (allowed, single)  # parallel allowed: a forced choice too
    assert single[0].function.arguments == allowed[0].function.arguments


def _input_items(messages: list[dict]) -> list[dict]:
    """SHOTS as Responses input items."""
    out: list[dict] = []
    for m in messages:
        if m["role"] == "tool":
            out.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        elif m.get("tool_calls"):
            out += [{"type": "function_call", "call_id": c["id"], "name": c["function"]["name"],
                     "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]  # fmt: skip
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_responses_parallel_tool_calls_false_gives_one_call(client, stream):
    kwargs = dict(
        model=MODEL, input=_input_items(SHOTS), tools=TOOLS, max_output_tokens=80, temperature=0, store=False
    )
    allowed = _create(client, stream, **kwargs)
    assert len(_calls(allowed)) == 2
    assert len({o.id for o in allowed.output}) == len(allowed.output), allowed.output  # streamed: once one id
    assert len(_calls(_create(client, stream, **kwargs, parallel_tool_calls=False))) == 1


def test_anthropic_disable_parallel_tool_use_gives_one_call(server):
    c = anthropic.Anthropic(base_url=server.base_url.removesuffix("/v1"), api_key="none", max_retries=0)
    system, msgs = SHOTS[0]["content"], []
    for m in SHOTS[1:]:
        if m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            if msgs[-1]["role"] == "user":
                msgs[-1]["content"].append(block)
            else:
                msgs.append({"role": "user", "content": [block]})
        elif m.get("tool_calls"):
            msgs.append({"role": "assistant", "content": [
                {"type": "tool_use", "id": t["id"], "name": "get_weather", "input": json.loads(t["function"]["arguments"])}
                for t in m["tool_calls"]]})  # fmt: skip
        else:
            msgs.append({"role": m["role"], "content": [{"type": "text", "text": m["content"]}]})
    tools = [{"name": "get_weather", "description": "Current weather for a city.", "input_schema": WEATHER}]
    kwargs = dict(
        model=MODEL, system=system, messages=msgs, tools=tools, max_tokens=80, extra_body={"temperature": 0}
    )
    for choice in ("auto", "any"):
        allowed = c.messages.create(**kwargs, tool_choice={"type": choice})
        single = c.messages.create(**kwargs, tool_choice={"type": choice, "disable_parallel_tool_use": True})
        count = [sum(b.type == "tool_use" for b in r.content) for r in (allowed, single)]
        assert count == [2, 1], (choice, allowed.content, single.content)


# -- a forced call cut by max_tokens: the same streamed or not ------------------------------------------
def _chat(client, stream: bool, **kwargs) -> tuple[str, list[tuple[str, str]], str]:
    """(content, [(name, arguments)], finish_reason) of a chat completion, streamed or not."""
    if not stream:
        c = client.chat.completions.create(**kwargs).choices[0]
        calls = [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]
        return c.message.content or "", calls, c.finish_reason
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            content += c.delta.content or ""
            for t in c.delta.tool_calls or []:
                name, args = calls.get(t.index, ("", ""))
                calls[t.index] = (name + (t.function.name or ""), args + (t.function.arguments or ""))
            finish = c.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def _items(resp) -> tuple[str, list[tuple]]:
    """A response's status and output items, item ids relative to the response id (call ids are
    derived from the request id, so they differ between two requests by design)."""
    out = []
    for o in resp.output:
        text = o.content[0].text if o.type == "message" else o.arguments
        out.append((o.type, o.id.replace(resp.id, "ID"), o.status, getattr(o, "name", None), text))
    return resp.status, out


def test_forced_calls_cut_by_max_tokens_are_the_same_streamed(client):
    """Parallel calls allowed under a forced choice, the second cut by ``max_tokens``: one call back and
    the cut markup as text; streamed and not give the same message, calls, finish reason, and on the
    Responses API the same items in the same order with the same ids and statuses (the streamed
    response used to put the call first, with other ids and statuses)."""
    kwargs = dict(model=MODEL, messages=SHOTS, tools=CHAT_TOOLS, tool_choice="required", temperature=0)
    for max_tokens in range(40, 80, 2):  # the first budget that cuts the second call
        plain = _chat(client, False, **kwargs, max_tokens=max_tokens)
        if len(plain[1]) == 1 and "<tool_call>" in plain[0]:
            break
    else:
        pytest.fail("no max_tokens in 40..78 cuts the second call")
    assert _chat(client, True, **kwargs, max_tokens=max_tokens) == plain
    rkw = dict(model=MODEL, input=_input_items(SHOTS), tools=TOOLS, tool_choice="required", temperature=0,
               max_output_tokens=max_tokens, store=False)  # fmt: skip
    whole, streamed = (_items(_create(client, s, **rkw)) for s in (False, True))
    assert whole[0] == "incomplete" and [i[0] for i in whole[1]].count("function_call") == 1, whole
    assert streamed == whole
