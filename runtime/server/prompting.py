"""From a validated chat request to prompt token ids: message checks, template dicts, rendering."""

from __future__ import annotations

from typing import Any, NamedTuple

from chat_templates.render import RenderedPrompt, render
from runtime.server.errors import bad_request
from runtime.server.protocol import ChatCompletionRequest, NamedToolChoice
from runtime.server.templates import TemplateInfo, forced_tool_prefix


class ChatPrompt(NamedTuple):
    """What the engine gets (``token_ids``) and what diagnostics and the output parser need."""

    messages: list[dict]
    tools: list[dict] | None
    rendered: RenderedPrompt
    token_ids: list[int]
    forced_prefix: str  # already part of token_ids; the parser sees it before the output
    tool_format: str | None  # None: tool calls are not parsed (no tools, or tool_choice "none")
    think_open: bool


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
            if m.reasoning_content is not None:
                d["reasoning_content"] = m.reasoning_content
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


def build_chat_prompt(req: ChatCompletionRequest, tokenizer: Any, template: TemplateInfo) -> ChatPrompt:
    messages = template_messages(req)
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    kwargs = dict(req.chat_template_kwargs or {})
    for reserved in ("messages", "tools", "add_generation_prompt", "chat_template"):
        kwargs.pop(reserved, None)
    try:
        rendered = render(tokenizer, messages, tools, template=template.source, **kwargs)
    except Exception as e:  # a template's raise_exception or a Jinja error on this input is the client's
        raise bad_request(
            f"the chat template cannot render these messages: {_one_line(e)}", "messages"
        ) from None
    choice = req.tool_choice
    forced = None
    if isinstance(choice, NamedToolChoice):
        forced = choice.function.name
    elif choice == "required":
        forced = "required"
    tool_format = template.tool_format if tools and choice != "none" else None
    prefix = forced_tool_prefix(tool_format, forced)
    ids = list(rendered.token_ids)
    if prefix:
        ids += encode_text(tokenizer, prefix, "tool_choice")
    think_open = template.reasoning and rendered.text.rstrip().endswith("<think>")
    return ChatPrompt(messages, tools, rendered, ids, prefix, tool_format, think_open)


def encode_text(tokenizer: Any, text: str, param: str) -> list[int]:
    """Token ids of ``text``; a string the tokenizer cannot take (a lone surrogate, ...) is a 400."""
    try:
        return tokenizer.encode(text, add_special_tokens=False)
    except Exception as e:  # tokenizers raises TypeError for unencodable str, others their own
        raise bad_request(f"{param} cannot be tokenised: {_one_line(e)}", param) from None


def _one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__
