"""An Anthropic request as the shared chat core sees it: template messages, tools, tool choice, sampling.

Anthropic's ``system`` becomes the first system message (text blocks joined by a blank line);
user ``tool_result`` blocks become ``tool`` messages (in block order, before the user's text);
assistant ``thinking`` becomes the template's reasoning, ``tool_use`` its tool calls.
``redacted_thinking`` has no text a local model could read, so it renders as nothing.

The Claude Code nonce: recent builds put ``x-anthropic-billing-header: ...cch=<nonce>`` in the
first system block, different on every request, which would make every prompt miss the prefix
cache from token 0.  It carries nothing for the model, so it is left out unless the server keeps it.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from kvreuse.runtime.server.anthropic.protocol import (
    CountTokensRequest,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    UnsupportedBlock,
)
from kvreuse.runtime.server.core.prompting import ChatInput
from kvreuse.runtime.server.errors import bad_request

NONCE_PREFIX = "x-anthropic-billing-header:"
SYSTEM_SEP = "\n\n"


class Breakpoint(NamedTuple):
    """A ``cache_control`` mark: the prefix ends after ``message`` (a chat message index, or
    ``"tools"``, or ``"end"`` for the top-level automatic form), kept for ``ttl`` seconds."""

    message: int | str
    ttl: float


class SystemBlock(NamedTuple):
    """Where a system block's text sits in the joined system message (for diagnostics)."""

    index: int
    char_start: int
    char_end: int
    nonce: bool


class Converted(NamedTuple):
    chat: ChatInput
    breakpoints: list[Breakpoint]
    system_blocks: list[SystemBlock]
    dropped_nonce: bool


def _system(
    req: CountTokensRequest, keep_nonce: bool
) -> tuple[str | None, list[SystemBlock], bool, float | None]:
    if req.system is None:
        return None, [], False, None
    blocks = [TextBlock(type="text", text=req.system)] if isinstance(req.system, str) else req.system
    parts: list[str] = []
    spans: list[SystemBlock] = []
    dropped, ttl, pos = False, None, 0
    for i, b in enumerate(blocks):
        nonce = b.text.startswith(NONCE_PREFIX)
        if nonce and not keep_nonce:
            dropped = True
            continue
        if parts:
            pos += len(SYSTEM_SEP)
        spans.append(SystemBlock(i, pos, pos + len(b.text), nonce))
        parts.append(b.text)
        pos += len(b.text)
        if b.cache_control is not None:
            ttl = max(ttl or 0.0, b.cache_control.seconds)
    return SYSTEM_SEP.join(parts), spans, dropped, ttl


def _call(b: ToolUseBlock) -> dict[str, Any]:
    return {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}


MAX_BREAKPOINTS = 4  # Anthropic's limit on blocks with cache_control (each one pins a prefix here)


def _cache_controls(req: CountTokensRequest) -> int:
    blocks = [*(req.system if isinstance(req.system, list) else []), *(req.tools or [])]
    for m in req.messages:
        blocks += m.content if isinstance(m.content, list) else []
    marked = sum(getattr(b, "cache_control", None) is not None for b in blocks)
    return marked + (req.cache_control is not None)


def convert(req: CountTokensRequest, keep_nonce: bool = False) -> Converted:
    """Raises a 400 (``APIError``) for content a text model cannot take; chat validation does the rest."""
    found = _cache_controls(req)
    if found > MAX_BREAKPOINTS:  # Anthropic's own message; 501 marks took 38 s of pins (issue 39)
        raise bad_request(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {found}."
        )
    system, spans, dropped, sys_ttl = _system(req, keep_nonce)
    msgs: list[dict[str, Any]] = []
    marks: list[Breakpoint] = []
    used: set[str] = set()
    if system is not None:
        msgs.append({"role": "system", "content": system})
        if sys_ttl is not None:
            marks.append(Breakpoint(0, sys_ttl))
    for i, m in enumerate(req.messages):
        blocks = [TextBlock(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        text: list[str] = []
        reasoning: list[str] = []
        calls: list[dict[str, Any]] = []
        ttl: float | None = None
        for j, b in enumerate(blocks):
            if isinstance(b, UnsupportedBlock):
                raise bad_request(
                    f"messages[{i}].content[{j}]: {b.type} blocks are not supported by this text-only "
                    "local model; send text", f"messages.{i}.content.{j}.type",
                )  # fmt: skip
            if b.cache_control is not None:
                ttl = max(ttl or 0.0, b.cache_control.seconds)
            if isinstance(b, ToolResultBlock):
                if m.role != "user":
                    raise bad_request(f"messages[{i}]: tool_result blocks belong in user messages")
                if b.tool_use_id not in used:
                    raise bad_request(
                        f"messages[{i}].content[{j}]: tool_result answers tool_use_id {b.tool_use_id!r}, "
                        "which no earlier tool_use block has", f"messages.{i}.content.{j}.tool_use_id",
                    )  # fmt: skip
                body = b.text()
                msgs.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": body if not b.is_error
                             else f"Error: {body}"})  # fmt: skip
            elif isinstance(b, ToolUseBlock):
                if m.role != "assistant":
                    raise bad_request(f"messages[{i}]: tool_use blocks belong in assistant messages")
                calls.append(_call(b))
                used.add(b.id)
            elif b.type == "thinking":
                reasoning.append(b.thinking)
            elif b.type == "text":
                text.append(b.text)
        if text or calls or reasoning or not isinstance(m.content, list):
            d: dict[str, Any] = {"role": m.role, "content": "".join(text) if text or not calls else None}
            if calls:
                d["tool_calls"] = calls
            if reasoning:
                d["reasoning_content"] = "".join(reasoning)
            msgs.append(d)
        if ttl is not None and msgs:
            marks.append(Breakpoint(len(msgs) - 1, ttl))
    tools = None
    if req.tools:
        tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                  "parameters": t.input_schema}} for t in req.tools]  # fmt: skip
        ttls = [t.cache_control.seconds for t in req.tools if t.cache_control is not None]
        if ttls:
            marks.append(Breakpoint("tools", max(ttls)))
    if req.cache_control is not None:
        marks.append(Breakpoint("end", req.cache_control.seconds))
    kwargs = None
    if req.thinking is not None and req.thinking.type != "adaptive":
        kwargs = {"enable_thinking": req.thinking.type == "enabled"}
    choice = req.tool_choice.type if req.tool_choice is not None and req.tools else None
    name = req.tool_choice.name if choice == "tool" else None
    budget = (
        req.thinking.budget_tokens if req.thinking is not None and req.thinking.type == "enabled" else None
    )
    parallel = not (req.tool_choice is not None and req.tool_choice.disable_parallel_tool_use)
    chat = ChatInput(msgs, tools, {"any": "required"}.get(choice, choice), name, kwargs, budget, parallel)
    return Converted(chat, marks, spans, dropped)
