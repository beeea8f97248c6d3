"""Responses API input items as the template messages the core renders, and output back as items.

A run of assistant-side items (``reasoning``, an assistant ``message``, ``function_call``s) is one
assistant message, as the model produced it: so a client that resends a response's output items gets
the same rendering as the stored conversation, and ``function_call_output`` items become ``tool``
messages that must answer a call made earlier (in this input or the stored conversation).
"""

from __future__ import annotations

from typing import Any

from kvreuse.runtime.server.errors import bad_request
from kvreuse.runtime.server.openai.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
    joined,
)


def input_messages(req: ResponsesRequest, open_calls: set[str]) -> list[dict[str, Any]]:
    """``req.input`` as template messages; ``open_calls`` (call ids made so far) grows with the calls."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
    out: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None  # the assistant message being assembled
    for i, item in enumerate(req.input):
        if (
            isinstance(item, MessageItem)
            and item.role != "assistant"
            or isinstance(item, FunctionCallOutputItem)
        ):
            turn = None
        elif turn is None or isinstance(item, MessageItem) and turn.get("content"):
            turn = {"role": "assistant", "content": None}
            out.append(turn)
        if isinstance(item, ReasoningItem):
            turn["reasoning_content"] = turn.get("reasoning_content", "") + item.text()  # type: ignore[index]
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            turn.setdefault("tool_calls", []).append(call)  # type: ignore[union-attr]
            open_calls.add(item.call_id)
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in open_calls:
                raise bad_request(
                    f"input[{i}]: function_call_output answers call_id {item.call_id!r}, which no earlier "
                    "function_call made", f"input.{i}.call_id",
                )  # fmt: skip
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": joined(item.output)})
        elif item.role == "assistant":
            turn["content"] = joined(item.content)  # type: ignore[index]
        else:
            role = "system" if item.role == "developer" else item.role
            out.append({"role": role, "content": joined(item.content)})
    for m in out:  # a turn of reasoning alone renders as an empty answer
        if m["role"] == "assistant" and m["content"] is None and not m.get("tool_calls"):
            m["content"] = ""
    return out


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": [part]}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}  # fmt: skip
