"""``POST /v1/completions``: a text or token-id prompt, no chat template."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from runtime.request import RequestOutput
from runtime.server.params import completion_logprobs, usage
from runtime.server.protocol import CompletionRequest
from runtime.server.run import EngineRun
from runtime.server.state import ServerState
from runtime.server.streaming import DONE, GuardedStream, Once, final_outputs, guarded_events, sse

log = logging.getLogger("kvreuse.server")


class CompletionRun(EngineRun):
    """One completion request: tokenised prompt, per-choice params and the response shapes."""

    def __init__(self, state: ServerState, req: CompletionRequest) -> None:
        prompt = req.prompt
        # tokenised once here; the engine streams get the ids
        ids = (
            list(prompt)
            if isinstance(prompt, list)
            else state.tokenizer.encode(prompt, add_special_tokens=False)
        )
        super().__init__(state, req, "cmpl", ids)
        self.prompt_text = prompt if isinstance(prompt, str) else state.tokenizer.decode(self.prompt_ids)

    def chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {**self.head("text_completion"), "choices": choices}

    def observe(self, outs: list[RequestOutput]) -> None:
        super().observe(outs)
        log.info("completion %s prompt=%d cached=%d", self.id, len(self.prompt_ids), outs[0].cached_tokens)


async def complete(run: CompletionRun) -> dict[str, Any]:
    ordered = await final_outputs(run.streams())
    echo = run.prompt_text if run.req.echo else ""
    tok = run.state.tokenizer
    choices = [
        {
            "index": i,
            "text": echo + o.text,
            "logprobs": completion_logprobs(tok, o.logprobs, len(echo))
            if run.req.logprobs is not None
            else None,
            "finish_reason": o.finish_reason,
        }
        for i, o in enumerate(ordered)
    ]
    run.observe(ordered)
    return {**run.chunk(choices), "usage": usage(len(run.prompt_ids), ordered)}


async def stream_events(run: CompletionRun) -> AsyncIterator[str]:
    n = run.req.n
    finals: dict[int, RequestOutput] = {}
    offsets = [len(run.prompt_text) if run.req.echo else 0] * n
    if run.req.echo:
        for i in range(n):
            yield sse(
                run.chunk([{"index": i, "text": run.prompt_text, "logprobs": None, "finish_reason": None}])
            )
    async with aclosing(run.streams()) as outputs:
        async for i, out in outputs:
            lp = None
            if run.req.logprobs is not None and out.new_logprobs:
                lp = completion_logprobs(run.state.tokenizer, out.new_logprobs, offsets[i])
            offsets[i] += len(out.delta)
            reason = out.finish_reason if out.finished else None
            if not (out.delta or lp or out.finished):
                continue
            c = run.chunk([{"index": i, "text": out.delta, "logprobs": lp, "finish_reason": reason}])
            if out.finished:
                finals[i] = out
                if len(finals) == n:
                    ordered = [finals[k] for k in range(n)]
                    c["usage"] = usage(len(run.prompt_ids), ordered)
                    run.observe(ordered)
            yield sse(c)
    if run.req.stream_options and run.req.stream_options.include_usage:
        yield sse({**run.chunk([]), "usage": usage(len(run.prompt_ids), [finals[k] for k in range(n)])})
    yield DONE


def stream_response(run: CompletionRun, release: Once) -> GuardedStream:
    return guarded_events(stream_events(run), run.id, release)
