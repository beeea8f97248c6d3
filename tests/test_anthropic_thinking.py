"""``thinking: {type: enabled, budget_tokens}`` with a template that has reasoning (the bundled Qwen3
template over the embedded model): the reasoning is opened, capped at exactly ``budget_tokens``
tokens, closed with the template's end-of-thinking marker, and the answer follows within
``max_tokens``.  The reasoning is checked against the engine itself: ``/v1/completions`` on the same
prompt ids (rendered by the template, plus the opening ``<think>``) for ``budget_tokens`` tokens."""

from __future__ import annotations

import anthropic
import pytest
from fastapi.testclient import TestClient

from kvreuse.chat_templates.render import render
from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.core.reasoning_budget import CLOSE
from kvreuse.runtime.server.state import ServerConfig

pytestmark = pytest.mark.timeout(600)
MODEL = "smol"
MSGS = [{"role": "user", "content": "Explain step by step why the sky is blue."}]


@pytest.fixture(scope="module")
def served():
    engine = Engine(None, kv_cache_memory="64M", max_model_len=2048)
    aengine = AsyncEngine(engine)
    config = ServerConfig(MODEL, chat_template="qwen3", allowed_hosts=("testserver",))
    app = create_app(aengine, config, on_shutdown=aengine.shutdown)
    with TestClient(app, raise_server_exceptions=False) as http:
        client = anthropic.Anthropic(
            base_url="http://testserver", api_key="x", http_client=http, max_retries=0
        )
        yield client, http, engine.tokenizer, app.state.kv.template.source


def _ask(client, budget: int, max_tokens: int, stream: bool):
    kw = dict(model=MODEL, max_tokens=max_tokens, messages=MSGS, extra_body={"temperature": 0},
              thinking={"type": "enabled", "budget_tokens": budget})  # fmt: skip
    if not stream:
        return client.messages.create(**kw)
    with client.messages.stream(**kw) as s:
        return s.get_final_message()


def test_budget_caps_the_reasoning_then_the_answer_follows(served):
    client, http, tok, template = served
    budget, max_tokens = 12, 40
    rendered = render(tok, MSGS, None, template=template, enable_thinking=True)
    assert rendered.text.endswith(
        "<|im_start|>assistant\n"
    )  # Qwen3 leaves opening the reasoning to the model
    prompt = list(rendered.token_ids) + tok.encode("<think>\n", add_special_tokens=False)
    _ask(client, budget, max_tokens, False)  # same cache state for every run below (greedy near-ties)
    engine_says = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": budget,
                                                    "temperature": 0}).json()  # fmt: skip
    first = engine_says["choices"][0]
    assert first["finish_reason"] == "length", first  # the model did not end within the budget
    full, streamed = _ask(client, budget, max_tokens, False), _ask(client, budget, max_tokens, True)
    for msg in (full, streamed):
        kinds = [b.type for b in msg.content]
        assert kinds[0] == "thinking" and msg.content[0].thinking == first["text"].strip(), msg
        assert "</think>" not in msg.content[0].thinking
        close = len(tok.encode(CLOSE, add_special_tokens=False))
        assert budget + close < msg.usage.output_tokens <= max_tokens
        assert msg.stop_reason in ("end_turn", "max_tokens")
    assert full.model_extra["kvreuse"]["reasoning"] == [
        {"budget": budget, "first_tokens": budget, "closed_by": "budget", "continued": True}
    ]
    assert [b.model_dump() for b in full.content] == [b.model_dump() for b in streamed.content]
    assert full.usage == streamed.usage


def test_no_room_to_answer_is_one_run(served):
    client, _, _, _ = served
    msg = _ask(client, 24, 25, False)  # after 24 reasoning tokens the close does not fit in one token
    (report,) = msg.model_extra["kvreuse"]["reasoning"]
    assert not report["continued"] and report["first_tokens"] == msg.usage.output_tokens <= 24
    assert report["closed_by"] == ("max_tokens" if msg.stop_reason == "max_tokens" else "model")
