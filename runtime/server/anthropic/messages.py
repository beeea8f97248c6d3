"""``POST /v1/messages``: a chat run on the shared core, answered as Anthropic content blocks.

Rendering, tool-call and reasoning parsing, diagnostics and metrics are the neutral core's
(``runtime/server/core/chat_run.py``); this module maps its output to Anthropic's blocks,
stop reasons, usage (``usage.py``) and streaming events, and pins ``cache_control`` prefixes.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from kvreuse.chat_templates.render import first_divergence
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.engine.outputs import RequestOutput
from kvreuse.runtime.sampling.params import SamplingParams
from kvreuse.runtime.server.anthropic.convert import Breakpoint, Converted
from kvreuse.runtime.server.anthropic.errors import error_object
from kvreuse.runtime.server.anthropic.protocol import MessagesRequest
from kvreuse.runtime.server.anthropic.usage import usage
from kvreuse.runtime.server.core.chat_run import ChatRun
from kvreuse.runtime.server.core.run import Caller, MakeParams
from kvreuse.runtime.server.core.streaming import final_outputs, join_parsed
from kvreuse.runtime.server.errors import bad_request
from kvreuse.runtime.server.state import ServerState


def tool_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


def tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def message_params(req: MessagesRequest, engine: Engine) -> MakeParams:
    """Anthropic's sampling fields (``temperature`` defaults to 1.0, as Anthropic's does)."""

    def make(prompt_len: int, choice: int) -> SamplingParams:
        try:
            return SamplingParams(
                max_tokens=req.max_tokens, temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p, top_k=-1 if req.top_k is None else req.top_k,
                stop=req.stop_sequences or None,
            )  # fmt: skip
        except ValueError as e:
            raise bad_request(str(e)) from None

    return make


class MessagesRun(ChatRun):
    """One Messages request on the engine (always one choice)."""

    def __init__(self, state: ServerState, caller: Caller, req: MessagesRequest, conv: Converted) -> None:
        session = req.metadata.user_id if req.metadata else None
        super().__init__(
            state, caller, conv.chat, "msg", 1, message_params(req, state.engine), session=session
        )
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.areq, self.conv = req, conv

    def message_head(self) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.areq.model or self.model}

    def usage(self, out: RequestOutput) -> dict[str, Any]:
        caching = self.state.engine.cache.caches_prefixes
        return {
            **usage(len(self.prompt_ids), out, self.state.engine.cache.page_size, caching),
            **self.clamp_usage(),
        }

    def stop(self, out: RequestOutput, n_calls: int) -> tuple[str, str | None]:
        if n_calls:
            return "tool_use", None
        if out.finish_reason == "length":
            return "max_tokens", None
        if out.finish_reason == "grammar_error":  # the output does not validate: not a normal end
            return "grammar_error", None
        # The detokenizer cuts the stop string off the text; the earliest one in the raw output is it.
        raw = self.state.tokenizer.decode(out.output_token_ids)
        found = [(raw.find(s), s) for s in self.areq.stop_sequences or [] if s and s in raw]
        return ("stop_sequence", min(found)[1]) if found else ("end_turn", None)

    def finish(self, outs: list[RequestOutput]) -> dict[str, Any]:
        """The chat core's diagnosis, naming the Anthropic system block where a break fell."""
        block = self._changed_system_block()
        ext = super().finish(outs)
        if block is not None and ext["cache"]["cause"] == "system_changed":
            ext["cache"]["system_block"] = block
            nonce = " (the x-anthropic-billing-header nonce)" if block["billing_header"] else ""
            ext["cache"]["detail"] += f"; the change is in system block {block['index']}{nonce}"
        return ext

    def _changed_system_block(self) -> dict[str, Any] | None:
        msgs = self.prompt.messages
        if not self.conv.system_blocks or msgs[0]["role"] != "system":
            return None
        entry, _ = self.state.diagnostics_for(self.scope.namespace).best_match(self.prompt_ids)
        if entry is None or not entry.messages or entry.messages[0].get("role") != "system":
            return None
        old, new = entry.messages[0]["content"], msgs[0]["content"]
        if old == new:
            return None
        at = first_divergence(old, new)
        span = next((s for s in self.conv.system_blocks if at < s.char_end), self.conv.system_blocks[-1])
        return {"index": span.index, "billing_header": span.nonce, "char": at - span.char_start}

    def breakpoint_end(self, bp: Breakpoint) -> int:
        segs = self.prompt.rendered.segments
        if bp.message == "end":
            return len(self.prompt.rendered.token_ids)
        if bp.message == "tools":
            return max((s.token_end for s in segs if s.kind == "tools"), default=0)
        return max((s.token_end for s in segs if s.message_index == bp.message), default=0)

    async def pin_breakpoints(self) -> list[dict[str, Any]]:
        """Pin the prefix up to each ``cache_control`` mark for its TTL (a retention hint: the
        pin only keeps pages from eviction, within the pin budget; it never changes the output)."""
        if not self.conv.breakpoints or not self.state.engine.cache.caches_prefixes:
            return []
        scope, ids = self.scope, self.prompt_ids
        marks = [(self.breakpoint_end(bp), bp.ttl) for bp in self.conv.breakpoints]

        def pin(engine: Any) -> list[dict[str, Any]]:
            out = []
            for end, ttl in marks:
                if end <= 0:
                    continue
                digest = hashlib.sha256(repr(ids[:end]).encode()).hexdigest()[:16]
                tokens, ok = engine.cache.pin_prefix(
                    (scope.namespace, "breakpoint", digest), ids[:end], scope, ttl
                )
                out.append({"tokens": tokens, "ttl_s": ttl, "pinned": ok})
            return out

        return await self.state.on_engine(pin)


def content_blocks(run: MessagesRun, out: RequestOutput) -> tuple[list[dict[str, Any]], int]:
    parsed = run.parse(out)
    blocks: list[dict[str, Any]] = []
    if parsed.reasoning:
        blocks.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
    if parsed.content:
        blocks.append({"type": "text", "text": parsed.content})
    for c in parsed.tool_calls:
        blocks.append({"type": "tool_use", "id": tool_id(), "name": c.name, "input": tool_input(c.arguments)})
    return blocks, len(parsed.tool_calls)


async def complete(run: MessagesRun) -> dict[str, Any]:
    out = (await final_outputs(run.streams()))[0]
    blocks, n_calls = content_blocks(run, out)
    reason, seq = run.stop(out, n_calls)
    ext = run.finish([out])
    ext["cache_control"] = await run.pin_breakpoints()
    return {**run.message_head(), "content": blocks, "stop_reason": reason, "stop_sequence": seq,
            "usage": run.usage(out), "kvreuse": ext}  # fmt: skip


def event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n"


class _Blocks:
    """The open content block of a stream: a new kind closes it and opens the next."""

    def __init__(self) -> None:
        self.index, self.kind = -1, None

    def open(self, kind: str, start: dict[str, Any]) -> list[str]:
        evs = self.close()
        self.index, self.kind = self.index + 1, kind
        return evs + [event("content_block_start", {"index": self.index, "content_block": start})]

    def close(self) -> list[str]:
        if self.kind is None:
            return []
        self.kind = None
        return [event("content_block_stop", {"index": self.index})]

    def delta(self, kind: str, start: dict[str, Any], delta: dict[str, Any]) -> list[str]:
        evs = self.open(kind, start) if self.kind != kind else []
        return evs + [event("content_block_delta", {"index": self.index, "delta": delta})]


async def stream_events(run: MessagesRun) -> AsyncIterator[str]:
    parser, blocks, n_calls, started = run.parser(0), _Blocks(), 0, False
    async with aclosing(run.streams()) as outputs:
        async for _, out in outputs:
            if not started:  # the cache figures are known once the request was admitted
                started = True
                head = {**run.message_head(), "content": [], "stop_reason": None, "stop_sequence": None,
                        "usage": {**run.usage(out), "output_tokens": 0}}  # fmt: skip
                yield event("message_start", {"message": head})
                yield event("ping", {})
            parsed = parser.feed(out)
            if out.finished:
                parsed = join_parsed(parsed, parser.finish())
            evs: list[str] = []
            if parsed.reasoning:
                evs += blocks.delta("thinking", {"type": "thinking", "thinking": "", "signature": ""},
                                    {"type": "thinking_delta", "thinking": parsed.reasoning})  # fmt: skip
            if parsed.content:
                evs += blocks.delta("text", {"type": "text", "text": ""},
                                    {"type": "text_delta", "text": parsed.content})  # fmt: skip
            for c in parsed.tool_calls:
                n_calls += 1
                start = {"type": "tool_use", "id": tool_id(), "name": c.name, "input": {}}
                args = json.dumps(tool_input(c.arguments_delta))
                evs += blocks.open("tool_use", start)
                evs.append(event("content_block_delta", {"index": blocks.index,
                                 "delta": {"type": "input_json_delta", "partial_json": args}}))  # fmt: skip
            for e in evs:
                yield e
            if out.finished:
                for e in blocks.close():
                    yield e
                reason, seq = run.stop(out, n_calls)
                ext = run.finish([out])
                ext["cache_control"] = await run.pin_breakpoints()
                yield event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": seq},
                                              "usage": run.usage(out), "kvreuse": ext})  # fmt: skip
                yield event("message_stop", {})


def error_events(e: Exception) -> list[str]:
    return [f"event: error\ndata: {json.dumps(error_object(500, str(e)))}\n\n"]
