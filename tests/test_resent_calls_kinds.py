"""Issue 50's conversation acceptance through the server, across the model kinds of
``test_conversation_tree_kinds.py`` (dense, MoE, hybrid, window, gpt-oss; tiny and random), with
what that test cannot drive (it sends raw token ids): chat templates and forced tool calls resent
by the client.  Seeded random conversation trees (chat completions): from a random earlier request,
the client resends its history (the answer as returned, a call's results) and continues with a user
append and a plain reply of random length (1-25 tokens, around page and chunk ends), a forced tool
call (``required`` or a named tool, at random), or a rewrite of an earlier system or user message at
a random depth (the system message's content sits before the first window of gemma3-odd's 7).

Every request prefills at most the tokens after its divergence from every sequence the server could
hold, from that point's page, plus the kind's slack (the tree test's: 0 dense and MoE, one window
for window models, the snapshot interval for the hybrid); and answers what a cold server (cache off)
answers.  The sequences, computed here independently of the server's own accounting: each earlier
request's prompt + output but its last (sampled, never computed) token, as the engine ran them; and
where a reply finished (a stop or a call) and the template renders it otherwise, the conversation
with that reply as the next request will render it (through the template here, up to where two
contents of the message after it part): the server prefills that form (``core/rerender.py``).
With ``-s`` the worst excess per kind is printed."""

from __future__ import annotations

import random
from typing import Any, NamedTuple

import openai
import pytest
from fastapi.testclient import TestClient

from kvreuse.chat_templates.render import first_divergence, render
from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.request import Request
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig
from tests.engine_drive import tiny_engine
from tests.harmony_model import TOOLS as HARMONY_TOOLS
from tests.harmony_model import make_gpt_oss
from tests.helpers import HYBRID_SHAPES, WINDOW_SHAPES, make_tiny_model, reset_cache, settle_background
from tests.test_conversation_tree_kinds import SLACK
from tests.test_rerendered_turns import TOOLS

PAGE = 4
SEEDS = (0, 1)
REQUESTS = 6  # per tree
REPLY_LENS = (1, 2, 3, 4, 5, 7, 8, 9, 16, 23, 24, 25)  # plain replies: around pages of 4, chunks of 24
WORDS = "the cache page window tool call weather city day look word reply turn agent model token".split()


@pytest.fixture(scope="module")
def worst():
    out: dict[str, int] = {}
    yield out
    print("\nresent conversation trees: worst prefill beyond the divergence's page, per kind:", out)


def _server(aengine: AsyncEngine, template: str) -> tuple[openai.OpenAI, TestClient]:
    app = create_app(aengine, ServerConfig("m", allowed_hosts=("testserver",), chat_template=template))
    http = TestClient(app).__enter__()
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0
    ), http


def _record(aengine: AsyncEngine) -> list[Request]:
    """Every request the engine is given, in order (a chat request, then its re-rendered turn's)."""
    seen: list[Request] = []
    stream = aengine.stream

    def recording(req: Request):
        seen.append(req)
        return stream(req)

    aengine.stream = recording  # type: ignore[method-assign]
    return seen


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


class Turn(NamedTuple):
    """A finished request: what was sent, the answer as the client resends it (with a call's results),
    and the sequences of it the server may hold."""

    messages: list[dict]
    resent: list[dict]
    held: list[list[int]]


class Tree:
    """One seeded conversation tree on a warm and a cold server with the same model."""

    def __init__(self, kind: str, seed: int, servers: tuple, seen: list[Request], tools: list[dict]):
        self.kind, self.rng, self.seen, self.tools = kind, random.Random(seed), seen, tools
        (self.oa, self.http), (self.oa_cold, _) = servers
        self.state = self.http.app.state.kv
        self.names = [t["function"]["name"] for t in tools]
        self.turns: list[Turn] = []

    def words(self) -> str:
        return " ".join(self.rng.choices(WORDS, k=self.rng.randint(1, 30))).capitalize() + "."

    def ids(self, messages: list[dict]) -> list[int]:
        """``messages`` through the server's template, with the generation prompt."""
        return render(
            self.state.tokenizer, messages, self.tools, template=self.state.template.source
        ).token_ids

    def rendered(self, messages: list[dict], resent: list[dict]) -> list[int]:
        """``messages`` + the answer as the next request renders it: with a message after it (the calls'
        results, else a user message), up to where two contents of that message part."""

        def with_(content: str) -> list[int]:
            follow = [{**m, "content": content} for m in resent[1:]] or [{"role": "user", "content": content}]
            return self.ids([*messages, resent[0], *follow])

        a, b = with_('{"a": 1}'), with_("[2]")
        return a[: first_divergence(a, b)]

    def parent(self) -> Turn:
        """An earlier turn: the last one half the time (deeper trees), else any."""
        return self.turns[-1] if self.rng.random() < 0.5 else self.rng.choice(self.turns)

    def next_request(self) -> tuple[list[dict], Any, int]:
        """From a random earlier turn (or none), the next request's messages, tool choice and max tokens."""
        rng = self.rng
        system = {"role": "system", "content": "Use the tools."}
        action = rng.choice(
            ["reply", "reply", "call", "call", "rewrite"] if self.turns else ["reply", "call"]
        )
        if action == "rewrite":
            base = self.parent().messages
            at = rng.choice([i for i, m in enumerate(base) if m["role"] in ("system", "user")])
            messages = [*base[:at], {**base[at], "content": self.words()}]
            if messages[-1]["role"] == "system":
                messages.append({"role": "user", "content": self.words()})
            action = rng.choice(["reply", "call"])
        elif self.turns:
            parent = self.parent()
            messages = parent.messages + parent.resent
            if messages[-1]["role"] != "tool" or action == "reply" and rng.random() < 0.5:
                messages = messages + [{"role": "user", "content": self.words()}]
        else:
            messages = [system, {"role": "user", "content": self.words()}]
        if action == "reply":
            return messages, "auto", rng.choice(REPLY_LENS)
        name = rng.choice(self.names)
        return messages, rng.choice(["required", {"type": "function", "function": {"name": name}}]), 64

    def step(self) -> int:
        """One request on both servers; returns its prefill beyond the bound."""
        messages, choice, max_tokens = self.next_request()
        kw = dict(model="m", messages=messages, tools=self.tools, tool_choice=choice, max_tokens=max_tokens,
                  temperature=0, parallel_tool_calls=False)  # fmt: skip
        before = len(self.seen)
        r, rc = self.oa.chat.completions.create(**kw), self.oa_cold.chat.completions.create(**kw)
        settle_background(self.http.app)
        answer = r.choices[0].message.model_dump(exclude_none=True)
        assert _said(answer) == _said(rc.choices[0].message.model_dump(exclude_none=True)), (messages, choice)
        assert r.choices[0].finish_reason == rc.choices[0].finish_reason
        req = self.seen[before]  # the chat request (a re-rendered turn's prefill comes after it)
        prompt, mine = req.prompt_ids, self.ids(messages)
        assert prompt[: len(mine)] == mine  # the server's prompt is the template's (+ a forced prefix)
        shared = 0
        for seq in (s for t in self.turns for s in t.held):
            n = min(len(seq), len(prompt) - 1)
            shared = max(shared, first_divergence(seq[:n], prompt[:n]))
        excess = req.prefilled_tokens - (len(prompt) - shared // PAGE * PAGE)
        assert excess <= SLACK[self.kind], (excess, req.prefilled_tokens, len(prompt), shared, choice)
        self.turns.append(self.finished(messages, answer, req, r.choices[0].finish_reason))
        return excess

    def finished(self, messages: list[dict], answer: dict, req: Request, finish: str) -> Turn:
        calls = answer.get("tool_calls") or []
        resent = {
            k: v for k, v in answer.items() if k in ("role", "content", "reasoning_content", "tool_calls")
        }
        if not calls:
            resent["content"] = resent.get("content") or ""
        results = [{"role": "tool", "tool_call_id": c["id"], "content": f'{{"n": {len(self.turns)}}}'}
                   for c in calls]  # fmt: skip
        generated = list(req.tokens)[:-1]  # the last, sampled, token is never computed
        held = [generated]
        if finish in ("stop", "tool_calls") or calls:
            again = self.rendered(messages, [resent, *results])
            if first_divergence(generated, again) < min(len(generated), len(again)):
                held.append(again)  # it breaks from what was generated: the server prefilled this form
        return Turn(messages, [resent, *results], held)


def _said(answer: dict) -> tuple:
    """An answer but its call ids (per request): content, reasoning, the calls by name and arguments."""
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in answer.get("tool_calls") or []]
    return answer.get("content"), answer.get("reasoning_content"), calls


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", list(SLACK))
def test_resent_conversation_trees_prefill_only_past_the_divergence(tmp_path, worst, kind):
    d = _model(tmp_path, kind)
    every = {"hybrid": 2, "window": 1, "gpt-oss": 4}.get(kind, 0)
    kw = dict(page_size=PAGE, num_pages=4096, chunk_size=24, snapshot_every=every)
    template, tools = ("gpt_oss", HARMONY_TOOLS) if kind == "gpt-oss" else ("chatml", TOOLS)
    warm, cold = AsyncEngine(tiny_engine(d, **kw)), AsyncEngine(tiny_engine(d, prefix_cache="off", **kw))
    servers, seen = (_server(warm, template), _server(cold, template)), _record(warm)
    try:
        for seed in SEEDS:
            reset_cache(warm)
            tree = Tree(kind, seed, servers, seen, tools)
            for _ in range(REQUESTS):
                excess = tree.step()
                worst[kind] = max(worst.get(kind, excess), excess)
    finally:
        for _, h in servers:
            h.__exit__(None, None, None)
        warm.shutdown()
        cold.shutdown()
