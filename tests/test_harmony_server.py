"""Harmony in the server (issue 31) on a tiny random gpt-oss with the real o200k-harmony tokenizer:
its markers are special tokens the detokenizer drops, so the server parses each output's token ids.

Through the official clients: a forced call comes back as OpenAI ``tool_calls`` (whole and streamed,
``finish_reason: "tool_calls"``, generation ended by ``<|call|>``), a Responses ``function_call`` item,
an Anthropic ``tool_use`` block (``stop_reason: "tool_use"``); ``reasoning_effort`` is written into the
system message, a change of it is what the cache diagnostics name; an effort gpt-oss has not is a 400.
The channel split itself (analysis -> reasoning, final -> content) is driven here with real engine
outputs of a scripted harmony reply through the server's own token feed.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from fastapi.testclient import TestClient

from kvreuse.chat_templates.harmony import HarmonyParser, parse_harmony
from kvreuse.chat_templates.render import first_divergence, render
from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.engine.outputs import RequestOutput
from kvreuse.runtime.loading.harmony_vocab import harmony_encoding
from kvreuse.runtime.request import PUBLIC
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.core.chat_run import token_feed
from kvreuse.runtime.server.core.rerender import history_ids, resend_break, rewarm
from kvreuse.runtime.server.state import ServerConfig
from tests.harmony_model import TOOLS, make_gpt_oss
from tests.helpers import settle_background

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Time in Oslo?"}]
CALL = 200012  # <|call|>
KEEP = {"chat_template_kwargs": {"keep_analysis": True}}


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    model = make_gpt_oss(tmp_path_factory.mktemp("harmony") / "model")
    engine = Engine(model_dir=str(model), dtype="float32", device="cpu", page_size=16, kv_cache_memory="64M",
                    max_model_len=4096)  # fmt: skip
    aengine = AsyncEngine(engine)
    config = ServerConfig("gpt", allowed_hosts=("testserver",), chat_template="gpt_oss")
    with TestClient(create_app(aengine, config, on_shutdown=aengine.shutdown)) as client:
        yield client


@pytest.fixture(scope="module")
def oa(http):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)


def _check_args(name: str, arguments: str) -> None:
    assert set(json.loads(arguments)) == ({"day"} if name == "get_weather" else {"tz"})


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_chat_completions_forced_call(oa, choice):
    r = oa.chat.completions.create(model="gpt", messages=MSGS, tools=TOOLS, tool_choice=choice, max_tokens=32,
                                   temperature=0, extra_body=KEEP)  # fmt: skip
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    [call] = c.message.tool_calls
    _check_args(call.function.name, call.function.arguments)
    if isinstance(choice, dict):
        assert call.function.name == "get_time"
    assert r.usage.completion_tokens < 32  # ended by <|call|>, not by the limit

    stream = oa.chat.completions.create(model="gpt", messages=MSGS, tools=TOOLS, tool_choice=choice,
                                        max_tokens=32, temperature=0, stream=True, extra_body=KEEP)  # fmt: skip
    name, args, finish, text = "", "", None, ""
    for chunk in stream:
        for ch in chunk.choices:
            text += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                name += tc.function.name or ""
                args += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    assert (name, args, finish, text) == (call.function.name, call.function.arguments, "tool_calls", "")


def test_responses_function_call_item(oa):
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    r = oa.responses.create(model="gpt", input="Time in Oslo?", tools=tools, tool_choice="required",
                            max_output_tokens=32, temperature=0, reasoning={"effort": "low"})  # fmt: skip
    calls = [i for i in r.output if i.type == "function_call"]
    assert len(calls) == 1 and r.status == "completed"
    _check_args(calls[0].name, calls[0].arguments)


def test_anthropic_tool_use_block(http):
    an = anthropic.Anthropic(base_url="http://testserver", api_key="none", http_client=http, max_retries=0)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]  # fmt: skip
    body = dict(model="gpt", max_tokens=32, messages=[{"role": "user", "content": "Time in Oslo?"}], tools=tools,
                tool_choice={"type": "tool", "name": "get_time"}, extra_body={"temperature": 0})  # fmt: skip
    m = an.messages.create(**body)
    assert m.stop_reason == "tool_use"
    [block] = [b for b in m.content if b.type == "tool_use"]
    assert block.name == "get_time" and set(block.input) == {"tz"}
    assert not [b for b in m.content if b.type == "text" and "<|" in b.text]
    with an.messages.stream(**body) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [
        (block.name, block.input)
    ]


def test_reasoning_effort_change_is_named(oa):
    msgs = [{"role": "system", "content": "Effort test."}, {"role": "user", "content": "Hello there."}]
    oa.chat.completions.create(
        model="gpt", messages=msgs, max_tokens=2, temperature=0, reasoning_effort="low"
    )
    same = oa.chat.completions.create(model="gpt", messages=msgs, max_tokens=2, temperature=0,
                                      reasoning_effort="low")  # fmt: skip
    assert same.model_extra["kvreuse"]["cache"]["cause"] == "append_only"
    other = oa.chat.completions.create(model="gpt", messages=msgs, max_tokens=2, temperature=0,
                                       reasoning_effort="high")  # fmt: skip
    cache = other.model_extra["kvreuse"]["cache"]
    assert cache["cause"] == "reasoning_effort_changed" and "low -> high" in cache["detail"]
    assert cache["divergence"]["new_text"].startswith(" high")
    assert cache["cached_tokens"] < cache["prompt_tokens"] // 2


def test_unknown_effort_is_a_400(oa):
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model="gpt", messages=MSGS, max_tokens=2, reasoning_effort="minimal")
    assert e.value.body["param"] == "reasoning_effort"


def _outputs(ids: list[int], step: int) -> list[RequestOutput]:
    base = dict(request_id="r", prompt_token_ids=[], new_logprobs=[], finish_reason=None, cached_tokens=0,
                prefilled_tokens=0, ttft_s=None, prefill_s=None, decode_s=None, e2e_s=None)  # fmt: skip
    return [RequestOutput(new_token_ids=ids[i : i + step], delta="", finished=False, **base)
            for i in range(0, len(ids), step)]  # fmt: skip


@pytest.mark.parametrize("step", [1, 3])
def test_token_feed_splits_channels(step):
    """The text deltas are empty (the detokenizer drops every marker): the split comes from the ids."""
    enc = harmony_encoding()
    reply = ("<|channel|>analysis<|message|>Need the time.<|end|><|start|>assistant<|channel|>commentary"
             "<|message|>Checking.<|end|><|start|>assistant to=functions.get_time<|channel|>commentary "
             '<|constrain|>json<|message|>{"tz": 1}<|call|>')  # fmt: skip
    feed = token_feed(HarmonyParser(enc, "r"))
    deltas = [feed.feed(o) for o in _outputs(enc.encode(reply, allowed_special="all"), step)] + [
        feed.finish()
    ]
    assert "".join(d.reasoning for d in deltas) == "Need the time."
    assert "".join(d.content for d in deltas) == "Checking."
    assert [(c.name, c.arguments_delta) for d in deltas for c in d.tool_calls] == [("get_time", '{"tz": 1}')]


def test_tool_choice_none_parses_no_call(oa):
    """``tool_choice: "none"`` keeps the tools in the prompt but a call's message is content."""
    enc = harmony_encoding()
    reply = ("<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.get_time"
             '<|channel|>commentary <|constrain|>json<|message|>{"tz": 1}<|call|>')  # fmt: skip
    feed = token_feed(HarmonyParser(enc, "r", calls=False))
    deltas = [feed.feed(o) for o in _outputs(enc.encode(reply, allowed_special="all"), 2)] + [feed.finish()]
    assert "".join(d.content for d in deltas) == 'Checking.{"tz": 1}'
    assert not [c for d in deltas for c in d.tool_calls]
    r = oa.chat.completions.create(model="gpt", messages=MSGS, tools=TOOLS, tool_choice="none", max_tokens=8,
                                   temperature=0)  # fmt: skip
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")


def test_responses_continue_after_a_call(oa, http):
    """``previous_response_id`` + the call's output: the call parsed again.  The stored sequence cannot
    be continued here (the template refuses the continuation's stub: a tool result after a turn without
    a call), so the whole is rendered, and the stock template writes the earlier call's header
    `` json`` where the model wrote `` <|constrain|>json``.  The server prefilled that rendering when
    the first turn ended (``core/rerender.py``), so the continuation reads the whole first turn, and
    the glue before the tool result, from the cache (issue 50: it broke at the header, then read 0
    tokens on a long prompt, ``snapshot_cut``)."""
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    kw = dict(model="gpt", tools=tools, tool_choice="required", max_output_tokens=32, temperature=0)
    first = oa.responses.create(input="Time in Oslo?", **kw)
    [call] = [i for i in first.output if i.type == "function_call"]
    state = http.app.state.kv
    settle_background(http.app)  # the client runs its tool meanwhile
    output = {"type": "function_call_output", "call_id": call.call_id, "output": '{"time": "09:00"}'}
    second = oa.responses.create(input=[output], previous_response_id=first.id, **kw)
    assert [i.type for i in second.output if i.type == "function_call"] == ["function_call"]
    cache = second.model_extra["kvreuse"]["cache"]
    assert cache["cause"] == "append_only", cache
    turn = {
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }

    def ids(result: str) -> list[int]:
        msgs = [{"role": "user", "content": "Time in Oslo?"}, {"role": "assistant", "content": None,
                "tool_calls": [turn]}, {"role": "tool", "tool_call_id": call.call_id, "content": result}]  # fmt: skip
        return render(state.tokenizer, msgs, TOOLS, template=state.template.source).token_ids

    result_at = first_divergence(ids('{"a": 1}'), ids("[2]"))  # where the tool result's content starts
    assert cache["cached_tokens"] == result_at // 16 * 16, (cache, result_at)


def test_recipient_after_the_channel_is_cached_as_rerendered(oa, http):
    """A model that writes the recipient after the channel (``<|channel|>commentary to=functions.X``,
    the order of the harmony docs' own example) has its call rendered in history with ``to=`` in the
    role header, so the next turn broke there (issue 50, 5a).  The server prefills the rendered form
    when the turn ends (``core/rerender.py``: the same job a finished chat run starts, given here the
    reply a random model cannot be made to write) and the next turn reads it up to the tool result."""
    state, enc = http.app.state.kv, harmony_encoding()
    messages = [{"role": "user", "content": "What time is it in Oslo?"}]
    prompt = render(state.tokenizer, messages, TOOLS, template=state.template.source).token_ids
    reply = enc.encode('<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"tz": 1}<|call|>',
                       allowed_special="all")  # fmt: skip
    parsed = parse_harmony(enc, reply, "r", calls=True)
    [call] = parsed.tool_calls
    assert (call.name, call.arguments) == ("get_time", '{"tz": 1}')
    rendered = history_ids(state, messages, TOOLS, parsed, {})
    at = first_divergence(prompt + reply, rendered)
    assert at < len(prompt) + len(reply) - 1, "the published template renders this call as generated"
    assert state.tokenizer.decode(rendered[at - 2 : at + 6]).find("to=functions") >= 0
    record: list[list[int]] = []
    http.portal.call(
        rewarm,
        state,
        PUBLIC,
        lambda: resend_break(state, messages, TOOLS, parsed, {}, prompt + reply),
        record.append,
    )
    assert record == [rendered]
    resent = [*messages, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"time": "09:00"}'}]  # fmt: skip
    r = oa.chat.completions.create(model="gpt", messages=resent, tools=TOOLS, max_tokens=2, temperature=0)
    cache = r.model_extra["kvreuse"]["cache"]

    def ids(result: str) -> list[int]:
        msgs = [{**m, "content": result} if m["role"] == "tool" else m for m in resent]
        return render(state.tokenizer, msgs, TOOLS, template=state.template.source).token_ids

    result_at = first_divergence(ids('{"a": 1}'), ids("[2]"))
    # the generated form alone (no re-rendered prefill) matched only up to the header's page
    assert at // 16 * 16 < result_at // 16 * 16 == cache["cached_tokens"], (cache, at, result_at)
