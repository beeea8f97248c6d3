"""Issue 50, item 4: a turn the client resends reads the whole of the earlier turn from the cache.

A forced tool call is generated in tokens the template's rendering of the same call need not produce
(the grammar's ``"}`` + ``}`` where the history tokenises ``"`` + ``}}``; the forced prefix's trailing
space tokenised apart; Llama 3's ``\\n\\n`` after the header split otherwise once text follows it;
harmony's stock template writing the call header its own way), so the next request lost the rest of
that turn.  The server now prefills the turn as it will be resent (``core/rerender.py``).

For each tool-call format of the bundled templates (Hermes ``<tool_call>``: ChatML and Qwen3; Llama 3
JSON; harmony: gpt-oss) and each forced choice (``required``, a named tool), on both APIs (chat
completions resending the messages; Responses with ``store: false`` resending the output items),
turn 2's cached tokens are exactly its prompt up to the start of the tool result's content (where
two renderings with different results part: an independent figure), rounded down to a page.
Qwen3.5's XML calls have no forced-call grammar (a 400, ``test_tool_choice_formats.py``): a call the
model makes itself (``auto``; its words forced from a script, ``server/scripted.py``, as a random model
makes none) is read whole and re-rendered as generated, so turn 2 reads all of turn 1 from the cache.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import openai
import pytest
from fastapi.testclient import TestClient

from kvreuse.chat_templates.render import first_divergence, render
from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig
from tests.harmony_model import make_gpt_oss
from tests.helpers import reset_cache, settle_background

PAGE = 4
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "day": {"type": "integer"}},
           "required": ["city", "day"]}  # fmt: skip
TOOLS = [
    {"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
     "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}},
    {"type": "function", "function": {"name": "get_weather", "description": "Weather on a day.", "parameters": WEATHER}},
]  # fmt: skip
MSGS = [{"role": "system", "content": "You answer with tools."},
        {"role": "user", "content": "What is the weather in Paris tomorrow? Also look up 'kv'."}]  # fmt: skip
CHOICES = {"required": "required", "named": {"type": "function", "function": {"name": "get_weather"}}}
TEMPLATES = ["chatml", "qwen3", "llama3", "gpt_oss"]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    smol = Engine(None, kv_cache_memory="64M", max_model_len=4096, page_size=PAGE)
    gpt = make_gpt_oss(tmp_path_factory.mktemp("rerender") / "gpt")
    harmony = Engine(model_dir=str(gpt), dtype="float32", device="cpu", page_size=PAGE, kv_cache_memory="64M",
                     max_model_len=4096)  # fmt: skip
    out = {"smol": AsyncEngine(smol), "gpt": AsyncEngine(harmony)}
    yield out
    for a in out.values():
        a.shutdown()


@pytest.fixture
def server(engines, request):
    template = request.node.callspec.params["template"]
    aengine = engines["gpt" if template == "gpt_oss" else "smol"]
    reset_cache(aengine)
    app = create_app(aengine, ServerConfig("m", allowed_hosts=("testserver",), chat_template=template))
    with TestClient(app) as http:
        yield (
            openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0),
            app,
        )


def _check(app, messages: list[dict], turn1: int, warmed: bool, cache: dict) -> None:
    """Turn 2 reads the whole of turn 1 (``turn1`` tokens; its last, sampled, is never computed) up to
    its last page; and where the server prefilled the resent form, through the next message's glue:
    up to the tool result's content (where two renderings with different results part), in pages."""
    content = _content_start(app, messages)
    whole = min(content, turn1 - 1) // PAGE * PAGE
    assert cache["cached_tokens"] == (content // PAGE * PAGE if warmed else whole), (cache, content, turn1)
    assert cache["cached_tokens"] >= whole and cache["cause"] == "append_only", cache


def _content_start(app, messages: list[dict]) -> int:
    st = app.state.kv

    def ids(result: str) -> list[int]:
        msgs = [{**m, "content": result} if m["role"] == "tool" else m for m in messages]
        return render(st.tokenizer, msgs, TOOLS, template=st.template.source).token_ids

    return first_divergence(ids('{"a": 1}'), ids("[2]"))


@pytest.mark.parametrize("choice", list(CHOICES))
@pytest.mark.parametrize("template", TEMPLATES)
def test_chat_resent_turn_is_cached(server, template, choice):
    oa, app = server
    before = settle_background(app)
    r = oa.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, tool_choice=CHOICES[choice],
                                   max_tokens=48, temperature=0, parallel_tool_calls=False)  # fmt: skip
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and calls
    warmed = settle_background(app) > before
    resent = [{"role": "assistant", "content": None,
               "tool_calls": [c.model_dump(exclude_none=True) for c in calls]}]  # fmt: skip
    results = [{"role": "tool", "tool_call_id": c.id, "content": '{"ok": 1}'} for c in calls]
    messages = MSGS + resent + results
    r2 = oa.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=2, temperature=0)
    _check(
        app,
        messages,
        r.usage.prompt_tokens + r.usage.completion_tokens,
        warmed,
        r2.model_extra["kvreuse"]["cache"],
    )


@pytest.mark.parametrize("choice", list(CHOICES))
@pytest.mark.parametrize("template", TEMPLATES)
def test_responses_resent_items_are_cached(server, template, choice):
    oa, app = server
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    forced = CHOICES[choice] if choice == "required" else {"type": "function", "name": "get_weather"}
    before = settle_background(app)
    items = [{"type": "message", "role": m["role"], "content": m["content"]} for m in MSGS]
    first = oa.responses.create(model="m", input=items, tools=tools, tool_choice=forced, store=False,
                                max_output_tokens=48, temperature=0, parallel_tool_calls=False)  # fmt: skip
    calls = [i for i in first.output if i.type == "function_call"]
    assert calls
    warmed = settle_background(app) > before
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": '{"ok": 1}'} for c in calls]
    resent = [i.model_dump(exclude_none=True) for i in first.output]
    second = oa.responses.create(model="m", input=items + resent + outputs, tools=tools, store=False,
                                 max_output_tokens=2, temperature=0)  # fmt: skip
    cache = second.model_extra["kvreuse"]["cache"]
    messages = MSGS + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls]},
        *({"role": "tool", "tool_call_id": c.call_id, "content": '{"ok": 1}'} for c in calls),
    ]  # fmt: skip
    _check(app, messages, first.usage.input_tokens + first.usage.output_tokens, warmed, cache)


@pytest.mark.parametrize("template", ["chatml"])
def test_a_turn_sent_at_once_waits_for_the_earlier_turns_prefill(server, template, monkeypatch):
    """A client that resends at once (a replay, a tool that returns instantly) reads what a client that
    ran its tools reads: the tenant's next request waits for its re-rendered prefill, so its cached
    tokens do not depend on timing.  The re-render is slowed so that turn 2 surely arrives first."""
    from kvreuse.runtime.server.core import chat_run

    def slow_resend_break(*args, **kwargs):
        time.sleep(1.0)
        return resend_break(*args, **kwargs)

    resend_break = chat_run.resend_break
    monkeypatch.setattr(chat_run, "resend_break", slow_resend_break)
    oa, app = server
    before = app.state.kv.background.counts["rewarm"]
    forced = CHOICES["named"]
    r = oa.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, tool_choice=forced,
                                   max_tokens=48, temperature=0, parallel_tool_calls=False)  # fmt: skip
    calls = r.choices[0].message.tool_calls
    resent = [{"role": "assistant", "content": None,
               "tool_calls": [c.model_dump(exclude_none=True) for c in calls]}]  # fmt: skip
    results = [{"role": "tool", "tool_call_id": c.id, "content": '{"ok": 1}'} for c in calls]
    messages = MSGS + resent + results
    r2 = oa.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=2, temperature=0)
    assert app.state.kv.background.counts["rewarm"] == before + 1  # this turn breaks (chatml, named)
    _check(
        app,
        messages,
        r.usage.prompt_tokens + r.usage.completion_tokens,
        True,
        r2.model_extra["kvreuse"]["cache"],
    )


XML_STEPS = {
    "one": {"tool": "get_weather", "input": {"city": "Paris", "day": 1}},
    "two": {"calls": [{"tool": "lookup", "input": {"q": "kv"}}, {"tool": "get_weather", "input": {"city": "Rome", "day": 2}}]},
}  # fmt: skip


@pytest.mark.parametrize("step", list(XML_STEPS))
def test_chat_resent_xml_call_is_cached(engines, tmp_path, step):
    """Qwen3.5's XML calls, made by the model (scripted): parsed whole (names and typed arguments), and
    turn 2 reads turn 1 as it was generated (no re-rendered prefill needed: the rendering extends it)."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"steps": [XML_STEPS[step]]}))
    aengine = engines["smol"]
    reset_cache(aengine)
    config = ServerConfig("m", allowed_hosts=("testserver",), chat_template="qwen3_5", script=str(script))
    app = create_app(aengine, config)
    with TestClient(app) as http:
        oa = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
        before = settle_background(app)
        r = oa.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, max_tokens=200, temperature=0)
        calls = r.choices[0].message.tool_calls
        want = XML_STEPS[step].get("calls") or [XML_STEPS[step]]
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            (w["tool"], w["input"]) for w in want
        ]
        warmed = settle_background(app) > before
        resent = [{"role": "assistant", "content": None,
                   "tool_calls": [c.model_dump(exclude_none=True) for c in calls]}]  # fmt: skip
        results = [{"role": "tool", "tool_call_id": c.id, "content": '{"ok": 1}'} for c in calls]
        messages = MSGS + resent + results
        r2 = oa.chat.completions.create(
            model="m", messages=messages, tools=TOOLS, max_tokens=2, temperature=0
        )
        assert not warmed  # the template renders the call as it was generated
        turn1 = r.usage.prompt_tokens + r.usage.completion_tokens
        _check(app, messages, turn1, warmed, r2.model_extra["kvreuse"]["cache"])


def test_a_server_closed_during_a_re_rendered_prefill_leaves_the_engine_idle(engines, monkeypatch):
    """CI's flake: a server closed while its re-rendered prefill ran left that request in the shared
    engine until the engine thread took its abort, and the next test's reset (from the test's thread)
    found it running.  Now the server cancels its background work as it closes (the abort queued before
    the close returns) and a reset on the engine's thread runs after it; the prefill is not counted.
    The re-render waits for the test (CI's machine once finished it before the steps were slowed) and
    the engine's steps are slowed, so that the close surely lands mid-prefill."""
    aengine = engines["smol"]
    reset_cache(aengine)
    app = create_app(aengine, ServerConfig("m", allowed_hosts=("testserver",), chat_template="chatml"))
    prep, gate = app.state.kv.prep, threading.Event()
    run = prep.run

    async def gated(tenant, fn, *args):
        if "warm_history" in getattr(fn, "__qualname__", ""):  # the rewarm's render, not the request's
            gated.waited = await asyncio.to_thread(gate.wait, 30)
        return await run(tenant, fn, *args)

    gated.waited = False
    monkeypatch.setattr(prep, "run", gated)
    with TestClient(app) as http:
        oa = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
        oa.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, tool_choice=CHOICES["named"],
                                   max_tokens=48, temperature=0, parallel_tool_calls=False)  # fmt: skip
        step = aengine.engine.step
        monkeypatch.setattr(aengine.engine, "step", lambda: time.sleep(0.3) or step())
        gate.set()
        for _ in range(1000):  # chatml's named call breaks where it is resent: its re-render is prefilled
            if aengine.run_idle(lambda e: sum(e.load()[:2])):  # queued or running
                break
            time.sleep(0.01)
        else:
            raise AssertionError("no re-rendered prefill started")
    assert gated.waited  # the rewarm did wait for the slowed steps
    assert not app.state.kv.background.pending
    reset_cache(aengine)  # raised "cannot reset the prefix cache while requests are running" on this thread
    assert aengine.run_idle(lambda e: e.load()[:2]) == (0, 0)
    assert app.state.kv.background.counts["rewarm"] == 0
