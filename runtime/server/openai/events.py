"""OpenAI's server-sent events: data-only frames, ``[DONE]``, chunk deltas for parsed output."""

from __future__ import annotations

import json
from typing import Any

from kvreuse.chat_templates.tool_calls import ParsedDelta
from kvreuse.runtime.engine.async_engine import EngineDead, RequestFailed

DONE = "data: [DONE]\n\n"


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def delta_messages(parsed: ParsedDelta) -> list[dict[str, Any]]:
    """The ``delta`` objects for one parsed chunk: reasoning, content, then each tool call as a
    header (id, name, empty arguments) followed by its arguments, the way OpenAI streams them."""
    out: list[dict[str, Any]] = []
    if parsed.reasoning:
        out.append({"reasoning_content": parsed.reasoning})
    if parsed.content:
        out.append({"content": parsed.content})
    for call in parsed.tool_calls:
        head = {
            "index": call.index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        out.append({"tool_calls": [head]})
        if call.arguments_delta:
            out.append(
                {"tool_calls": [{"index": call.index, "function": {"arguments": call.arguments_delta}}]}
            )
    return out


def error_events(e: Exception) -> list[str]:
    code = {EngineDead: "engine_dead", RequestFailed: "request_failed"}.get(type(e))
    return [sse({"error": {"message": str(e), "type": "server_error", "param": None, "code": code}}), DONE]
