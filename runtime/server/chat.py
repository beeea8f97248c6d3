"""``POST /v1/chat/completions``: render, generate n choices, parse tool calls/reasoning, report the cache."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from chat_templates.parsers import OutputParser, parse_full
from runtime.request import RequestOutput
from runtime.server.constraints import chat_grammar
from runtime.server.diagnostics import HistoryEntry, cached_by_tier
from runtime.server.params import chat_logprobs
from runtime.server.prompting import ChatPrompt, build_chat_prompt
from runtime.server.protocol import ChatCompletionRequest
from runtime.server.run import EngineRun
from runtime.server.state import ServerState
from runtime.server.streaming import DONE, delta_messages, final_outputs, join_parsed, sse

log = logging.getLogger("kvreuse.server")


class ChatRun(EngineRun):
    """One chat request in flight: its prompt, the n engine streams, and bookkeeping at the end."""

    def __init__(self, state: ServerState, req: ChatCompletionRequest) -> None:
        self.prompt: ChatPrompt = build_chat_prompt(req, state.tokenizer, state.template)
        grammar = chat_grammar(req, self.prompt.tool_format)
        super().__init__(state, req, "chatcmpl", [self.prompt.token_ids], grammar)

    def parser(self, i: int) -> OutputParser:
        p = self.prompt
        parser = OutputParser(p.tool_format, self.state.template.reasoning, p.think_open, f"{self.id}-{i}")
        if p.forced_prefix:
            parser.feed(p.forced_prefix)  # markup only: the parser holds it, nothing is emitted
        return parser

    def finish(self, outs: list[RequestOutput]) -> dict[str, Any]:
        """Usage, diagnosis, metrics and the log line; returns the ``kvreuse`` extension object."""
        st, p = self.state, self.prompt
        first = outs[0]
        diagnostics = st.diagnostics_for(self.scope.namespace)
        diag = diagnostics.diagnose(
            p.rendered, p.messages, p.tools, p.token_ids, first.cached_tokens, first.snapshot_cut
        )
        diagnostics.record(
            HistoryEntry(
                list(p.token_ids) + list(first.output_token_ids), len(p.token_ids), p.messages, p.tools
            )
        )
        diag["cached_by_tier"] = cached_by_tier(first)
        st.metrics.cache_miss.labels(diag["cause"]).inc()
        self.observe(outs)
        div = diag["divergence"] or {}
        log.info(
            "chat %s prompt=%d cached=%d reusable=%d cause=%s at=%s where=%s",
            self.id, diag["prompt_tokens"], diag["cached_tokens"], diag["reusable_tokens"], diag["cause"],
            div.get("token_index"), div.get("where"),
        )  # fmt: skip
        return {"cache": diag}

    def finish_reason(self, out: RequestOutput, n_calls: int) -> str:
        return "tool_calls" if n_calls else (out.finish_reason or "stop")


async def complete(run: ChatRun) -> dict[str, Any]:
    ordered = await final_outputs(run.streams())
    p = run.prompt
    choices = []
    for i, out in enumerate(ordered):
        parsed = parse_full(
            p.forced_prefix + out.text,
            p.tool_format,
            run.state.template.reasoning,
            p.think_open,
            f"{run.id}-{i}",
        )
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": parsed.content or (None if parsed.tool_calls else ""),
        }
        if parsed.reasoning:
            msg["reasoning_content"] = parsed.reasoning
        if parsed.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in parsed.tool_calls
            ]
        choice = {"index": i, "message": msg, "finish_reason": run.finish_reason(out, len(parsed.tool_calls))}
        choice["logprobs"] = chat_logprobs(run.state.tokenizer, out.logprobs) if run.req.logprobs else None
        choices.append(choice)
    return {
        **run.head("chat.completion"),
        "choices": choices,
        "usage": run.usage(ordered),
        "kvreuse": run.finish(ordered),
    }


async def stream_events(run: ChatRun) -> AsyncIterator[str]:
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
            parsed = parsers[i].feed(out.delta)
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
