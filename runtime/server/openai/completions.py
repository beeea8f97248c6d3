"""``POST /v1/completions``: text or token-id prompts (one or a batch), no chat template."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from kvreuse.runtime.engine.outputs import RequestOutput
from kvreuse.runtime.server.core.prompting import encode_text
from kvreuse.runtime.server.core.run import Caller, EngineRun
from kvreuse.runtime.server.core.streaming import final_outputs
from kvreuse.runtime.server.openai.events import DONE, sse
from kvreuse.runtime.server.openai.events import (
    error_events as error_events,  # the stream error shape (generate)
)
from kvreuse.runtime.server.openai.params import completion_logprobs
from kvreuse.runtime.server.openai.protocol import CompletionRequest
from kvreuse.runtime.server.openai.run import OpenAIRun, body_params
from kvreuse.runtime.server.state import ServerState

log = logging.getLogger("kvreuse.server")


class CompletionRun(OpenAIRun, EngineRun):
    """One completion request: tokenised prompts, per-choice params and the response shapes."""

    def __init__(self, state: ServerState, caller: Caller, req: CompletionRequest) -> None:
        # tokenised once here; the engine streams get the ids
        ids = [
            list(p) if isinstance(p, list) else encode_text(state.tokenizer, p, "prompt", prompt=True)
            for p in req.prompts()
        ]
        self.req = req
        super().__init__(state, caller, "cmpl", ids, req.n, body_params(state, req), session=req.user)
        self.setup()
        self.prompt_texts = [
            p if isinstance(p, str) else state.tokenizer.decode(t)
            for p, t in zip(req.prompts(), self.prompts)
        ]

    def chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {**self.head("text_completion"), "choices": choices}

    def echo_text(self, index: int) -> str:
        return self.prompt_texts[index // self.req.n] if self.req.echo else ""

    async def echo_logprobs(self) -> list[dict[str, Any] | None]:
        """Per prompt: its tokens' logprobs (``echo`` with ``logprobs``), else None."""
        if not (self.req.echo and self.req.logprobs is not None):
            return [None] * len(self.prompts)
        tok, top = self.state.tokenizer, self.req.logprobs
        out = []
        for ids in self.prompts:
            entries = await self.state.on_engine(lambda e, ids=ids: e.prompt_logprobs(ids, top))
            out.append(completion_logprobs(tok, entries))
        return out

    def observe(self, outs: list[RequestOutput]) -> None:
        super().observe(outs)
        cached = sum(o.cached_tokens for o in outs[:: self.req.n])
        log.info("completion %s prompt=%d cached=%d", self.id, sum(map(len, self.prompts)), cached)


def _join(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    """Prompt logprobs followed by the generated ones (offsets already absolute)."""
    return b if a is None else {k: a[k] + b[k] for k in b}


async def complete(run: CompletionRun) -> dict[str, Any]:
    echoed = await run.echo_logprobs()
    ordered = await final_outputs(run.streams())
    tok, n = run.state.tokenizer, run.req.n
    choices = []
    for i, o in enumerate(ordered):
        echo = run.echo_text(i)
        lp = None
        if run.req.logprobs is not None:
            lp = _join(echoed[i // n], completion_logprobs(tok, o.logprobs, len(echo)))
        choices.append({"index": i, "text": echo + o.text, "logprobs": lp, "finish_reason": o.finish_reason})
    run.observe(ordered)
    return {**run.chunk(choices), "usage": run.usage(ordered)}


async def stream_events(run: CompletionRun) -> AsyncIterator[str]:
    k = run.num_choices
    finals: dict[int, RequestOutput] = {}
    offsets = [len(run.echo_text(i)) for i in range(k)]
    rule = run.stream_usage

    def chunk(i: int, text: str, lp: Any, reason: str | None) -> dict[str, Any]:
        return rule.chunk(run.chunk([{"index": i, "text": text, "logprobs": lp, "finish_reason": reason}]))

    if run.req.echo:
        echoed = await run.echo_logprobs()
        for i in range(k):
            yield sse(chunk(i, run.echo_text(i), echoed[i // run.req.n], None))
    async with aclosing(run.streams()) as outputs:
        async for i, out in outputs:
            lp = None
            if run.req.logprobs is not None and out.new_logprobs:
                lp = completion_logprobs(run.state.tokenizer, out.new_logprobs, offsets[i])
            offsets[i] += len(out.delta)
            reason = out.finish_reason if out.finished else None
            if not (out.delta or lp or out.finished):
                continue
            if out.finished:
                finals[i] = out
                if len(finals) == k:
                    run.observe([finals[j] for j in range(k)])
            yield sse(chunk(i, out.delta, lp, reason))
    final = rule.final(run.head("text_completion"), run.usage([finals[j] for j in range(k)]), {})
    if final is not None:
        yield sse(final)
    yield DONE
