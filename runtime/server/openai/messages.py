"""An OpenAI chat request in the core's neutral form: template messages (with their checks), tools, choice."""

from __future__ import annotations

from typing import Any

from kvreuse.runtime.server.core.prompting import ChatInput, effort_kwargs
from kvreuse.runtime.server.core.rerender import assistant_message
from kvreuse.runtime.server.errors import bad_request
from kvreuse.runtime.server.openai.protocol import ChatCompletionRequest, NamedToolChoice
from kvreuse.runtime.server.templates import TemplateInfo

__all__ = ["assistant_message", "chat_input", "template_messages"]


def chat_input(req: ChatCompletionRequest, template: TemplateInfo) -> ChatInput:
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    choice, name = req.tool_choice, None
    if isinstance(choice, NamedToolChoice):
        choice, name = "tool", choice.function.name
    parallel = req.parallel_tool_calls is not False
    kwargs = {
        **(req.chat_template_kwargs or {}),
        **effort_kwargs(template, req.reasoning_effort, "reasoning_effort"),
    }
    return ChatInput(template_messages(req), tools, choice, name, kwargs or None, None, parallel)


def template_messages(req: ChatCompletionRequest) -> list[dict]:
    """Messages as templates expect them; tool results must answer a call made earlier."""
    out: list[dict] = []
    open_calls: set[str] = set()
    for i, m in enumerate(req.messages):
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.role == "assistant":
            if d["content"] is None and not m.tool_calls:
                raise bad_request(
                    f"messages[{i}]: an assistant message needs content or tool_calls", f"messages.{i}"
                )
            if (reasoning := m.reasoning_text()) is not None:
                d["reasoning_content"] = reasoning
            if m.tool_calls:
                d["tool_calls"] = [c.model_dump() for c in m.tool_calls]
                open_calls.update(c.id for c in m.tool_calls)
        elif m.role == "tool":
            if m.tool_call_id not in open_calls:
                raise bad_request(
                    f"messages[{i}]: tool message answers tool_call_id {m.tool_call_id!r}, "
                    "which no earlier assistant message called",
                    f"messages.{i}.tool_call_id",
                )
            d["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    return out
