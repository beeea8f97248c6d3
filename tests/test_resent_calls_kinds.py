"""Issue 50's conversation acceptance for forced tool calls resent by the client, across the model
kinds of ``test_conversation_tree_kinds.py`` (dense, MoE, hybrid, window, gpt-oss; tiny and random):
a session of turns alternating ``tool_choice: "required"`` and a named tool, each resending the whole
history with the calls' results, through the server (chat completions).  Every turn prefills at most
the tokens after the earlier turn's end as the client resends it (where two different tool results
part, rounded down to a page) plus the kind's slack (the tree test's: 0 dense and MoE, one window for
window models, the snapshot interval for the hybrid), and answers what a cold server (cache off)
answers.  With ``-s`` the worst excess per kind is printed."""

from __future__ import annotations

import time

import openai
import pytest
from fastapi.testclient import TestClient

from kvreuse.chat_templates.render import first_divergence, render
from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig
from tests.engine_drive import tiny_engine
from tests.harmony_model import TOOLS as HARMONY_TOOLS
from tests.harmony_model import make_gpt_oss
from tests.helpers import HYBRID_SHAPES, WINDOW_SHAPES, make_tiny_model
from tests.test_conversation_tree_kinds import SLACK
from tests.test_rerendered_turns import TOOLS

PAGE = 4
TURNS = 3


@pytest.fixture(scope="module")
def worst():
    out: dict[str, int] = {}
    yield out
    print("\nresent forced calls: worst prefill beyond the resent turn's page, per kind:", out)


def _server(aengine: AsyncEngine, template: str) -> tuple[openai.OpenAI, TestClient]:
    app = create_app(aengine, ServerConfig("m", allowed_hosts=("testserver",), chat_template=template))
    http = TestClient(app).__enter__()
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0
    ), http


def _settle(http: TestClient) -> int:
    """The server's re-rendered turns prefilled so far, once the last is done."""
    background = getattr(http.app.state.kv, "background", None)  # None: a server without them
    for _ in range(600):
        if background is None or not background.pending:
            break
        time.sleep(0.02)
    return background.counts["rewarm"] if background is not None else 0


VOCAB = 49152  # the embedded tokenizer's, which the templates' text needs (the tree test's models have 512)


def _model(root, kind: str):
    """The tree test's kinds with the embedded tokenizer's whole vocabulary."""
    if kind == "dense":
        return make_tiny_model(root / kind, "llama", vocab=VOCAB)
    if kind == "moe":
        return make_tiny_model(root / kind, "qwen3_moe", vocab=VOCAB, num_experts=8, num_experts_per_tok=2,
                               moe_intermediate_size=32, norm_topk_prob=True, num_hidden_layers=3)  # fmt: skip
    if kind == "hybrid":
        kw = dict(HYBRID_SHAPES["gqa-3to1-untied"])
        tie = kw.pop("tie", False)
        return make_tiny_model(root / kind, "qwen3_5_text", tie, vocab=VOCAB, initializer_range=0.1, **kw)
    if kind == "window":
        arch, kw = WINDOW_SHAPES["gemma3-odd"]
        kw = dict(kw)
        tie = kw.pop("tie", False)
        return make_tiny_model(root / kind, arch, tie, vocab=VOCAB, initializer_range=0.1, **kw)
    return make_gpt_oss(root / kind)


def _answer(r) -> tuple:
    m = r.choices[0].message  # call ids are per request: the calls by name and arguments
    return m.content, [(c.function.name, c.function.arguments) for c in m.tool_calls or []]


def _resent_end(state, messages: list[dict], tools: list[dict]) -> int:
    """Where the earlier turn as resent ends: two renderings with different tool results part there."""

    def ids(result: str) -> list[int]:
        msgs = [{**m, "content": result} if m["role"] == "tool" else m for m in messages]
        return render(state.tokenizer, msgs, tools, template=state.template.source).token_ids

    return first_divergence(ids('{"a": 1}'), ids("[2]"))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", list(SLACK))
def test_resent_forced_calls_prefill_only_the_new_turn(tmp_path, worst, kind):
    d = _model(tmp_path, kind)
    every = {"hybrid": 2, "window": 1, "gpt-oss": 4}.get(kind, 0)
    kw = dict(page_size=PAGE, num_pages=1024, chunk_size=24, snapshot_every=every)
    template, tools = ("gpt_oss", HARMONY_TOOLS) if kind == "gpt-oss" else ("chatml", TOOLS)
    names = [t["function"]["name"] for t in tools]
    warm, cold = AsyncEngine(tiny_engine(d, **kw)), AsyncEngine(tiny_engine(d, prefix_cache="off", **kw))
    (oa, http), (oa_cold, http_cold) = _server(warm, template), _server(cold, template)
    try:
        messages = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "Go."}]
        state = http.app.state.kv
        warmed, last = False, 0
        for turn in range(TURNS):
            warms = _settle(http)
            choice = (
                "required" if turn % 2 == 0 else {"type": "function", "function": {"name": names[turn % 2]}}
            )
            kw2 = dict(model="m", messages=messages, tools=tools, tool_choice=choice, max_tokens=64, temperature=0,
                       parallel_tool_calls=False)  # fmt: skip
            r, rc = oa.chat.completions.create(**kw2), oa_cold.chat.completions.create(**kw2)
            assert _answer(r) == _answer(rc), turn
            cache = r.model_extra["kvreuse"]["cache"]
            if turn:
                # where it parts from every earlier sequence: the resent turn's end if the server
                # prefilled it, else also the generated turn's (its last, sampled, token never computed)
                end = _resent_end(state, messages, tools)
                start = (end if warmed else min(end, last - 1)) // PAGE * PAGE
                excess = cache["prompt_tokens"] - cache["cached_tokens"] - (cache["prompt_tokens"] - start)
                worst[kind] = max(worst.get(kind, 0), excess)
                assert excess <= SLACK[kind], (turn, cache, start)
            calls = r.choices[0].message.tool_calls
            assert calls, turn
            warmed, last = _settle(http) > warms, r.usage.prompt_tokens + r.usage.completion_tokens
            messages = messages + [
                {"role": "assistant", "content": None, "tool_calls": [c.model_dump(exclude_none=True) for c in calls]},
                *({"role": "tool", "tool_call_id": c.id, "content": f'{{"n": {turn}}}'} for c in calls),
            ]  # fmt: skip
    finally:
        for h in (http, http_cold):
            h.__exit__(None, None, None)
        warm.shutdown()
        cold.shutdown()
