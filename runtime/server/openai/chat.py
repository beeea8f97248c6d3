"""``POST /v1/chat/completions``: render, generate n choices, parse tool calls/reasoning, report the cache."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from kvreuse.runtime.engine.outputs import RequestOutput
from kvreuse.runtime.server.core import chat_run
from kvreuse.runtime.server.core.run import Caller
from kvreuse.runtime.server.core.streaming import final_outputs, join_parsed
from kvreuse.runtime.server.openai.constraints import response_grammar
from kvreuse.runtime.server.openai.events import DONE, delta_messages, sse
from kvreuse.runtime.server.openai.events import (
    error_events as error_events,  # the stream error shape (generate)
)
from kvreuse.runtime.server.openai.messages import assistant_message, chat_input
from kvreuse.runtime.server.openai.params import chat_logprobs
from kvreuse.runtime.server.openai.protocol import ChatCompletionRequest
from kvreuse.runtime.server.openai.run import OpenAIRun, body_params
from kvreuse.runtime.server.state import ServerState


class ChatCompletionRun(OpenAIRun, chat_run.ChatRun):
    """One chat request in flight: the core's chat run, answered in OpenAI's shapes."""

    def __init__(self, state: ServerState, caller: Caller, req: ChatCompletionRequest) -> None:
        self.req = req
        super().__init__(state, caller, chat_input(req, state.template), "chatcmpl", req.n, body_params(state, req),
                         response_grammar(req), req.user)  # fmt: skip
        self.setup()

    def finish_reason(self, out: RequestOutput, n_calls: int) -> str:
        return "tool_calls" if n_calls else (out.finish_reason or "stop")


async def complete(run: ChatCompletionRun) -> dict[str, Any]:
    ordered = await final_outputs(run.streams())
    choices = []
    for i, out in enumerate(ordered):
        parsed = run.parse(out, i)
        msg = assistant_message(parsed)
        choice = {"index": i, "message": msg, "finish_reason": run.finish_reason(out, len(parsed.tool_calls))}
        choice["logprobs"] = chat_logprobs(run.state.tokenizer, out.logprobs) if run.req.logprobs else None
        choices.append(choice)
    return {
        **run.head("chat.completion"),
        "choices": choices,
        "usage": run.usage(ordered),
        "kvreuse": run.finish(ordered),
    }


async def stream_events(run: ChatCompletionRun) -> AsyncIterator[str]:
    n = run.req.n
    parsers = [run.parser(i) for i in range(n)]
    calls = [0] * n
    finals: dict[int, RequestOutput] = {}
    rule = run.stream_usage

    def chunk(
        i: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None
    ) -> dict[str, Any]:
        c = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return rule.chunk({**run.head("chat.completion.chunk"), "choices": [c]})

    for i in range(n):
        yield sse(chunk(i, {"role": "assistant", "content": ""}))
    extension: dict[str, Any] = {}
    async with aclosing(run.streams()) as outputs:
        async for i, out in outputs:
            parsed = parsers[i].feed(out)
            if out.finished:
                parsed = join_parsed(parsed, parsers[i].finish())
            lp = None
            if run.req.logprobs and out.new_logprobs:
                lp = chat_logprobs(run.state.tokenizer, out.new_logprobs)
            calls[i] += len(parsed.tool_calls)
            for delta in delta_messages(parsed) or ([{}] if lp else []):
                yield sse(chunk(i, delta, logprobs=lp))
                lp = None
            if out.finished:
                finals[i] = out
                last = chunk(i, {}, run.finish_reason(out, calls[i]))
                if len(finals) == n:
                    extension = {"kvreuse": run.finish([finals[k] for k in range(n)])}
                    if not rule.include:  # the extension rides the last chunk; usage never does
                        last.update(extension)
                yield sse(last)
    final = rule.final(run.head("chat.completion.chunk"), run.usage([finals[k] for k in range(n)]), extension)
    if final is not None:
        yield sse(final)
    yield DONE
