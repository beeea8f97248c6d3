"""A Responses request's conversation and prompt: fresh, or continuing a stored response's token sequence.

With ``previous_response_id`` the prompt is the stored sequence (prompt + output, token for token as
the model produced it) followed by only the new items, rendered as an append: the conversation is
rendered with the stored assistant turn replaced by a marker, and what follows the marker (the turn's
closing glue, the new messages, the generation prompt) is tokenised and appended.  The history is
never re-tokenised, so its cached pages match exactly; a template whose rendering of the earlier turns
depends on what comes later (the marker missing or twice) falls back to rendering the whole.
"""

from __future__ import annotations

from typing import Any

from kvreuse.chat_templates.render import RenderedPrompt, render_text
from kvreuse.runtime.server.core.prompting import (
    ChatInput,
    ChatPrompt,
    build_chat_prompt,
    effort_kwargs,
    encode_text,
    prompt_from,
    render_kwargs,
)
from kvreuse.runtime.server.openai.responses_input import input_messages
from kvreuse.runtime.server.openai.responses_protocol import FunctionChoice, ResponsesRequest
from kvreuse.runtime.server.openai.responses_store import StoredResponse
from kvreuse.runtime.server.templates import TemplateInfo

MARKER = "\ue000kvreuse-stored-turn\ue000"  # private-use characters: no client text renders them


def template_kwargs(req: ResponsesRequest, template: TemplateInfo) -> dict[str, Any]:
    """``reasoning.effort`` onto the template's thinking switch (where it has one): none/minimal off;
    gpt-oss's effort goes into its system message."""
    effort = req.reasoning.effort if req.reasoning is not None else None
    if template.harmony is not None:
        return effort_kwargs(template, effort, "reasoning.effort")
    if effort is None or not template.reasoning:
        return {}
    return {"enable_thinking": req.reasoning.effort not in ("none", "minimal")}


def chat_input(req: ResponsesRequest, template: TemplateInfo, prev: StoredResponse | None) -> ChatInput:
    """The whole conversation: the stored one (its instructions replaced by this request's) + the input."""
    system = [{"role": "system", "content": req.instructions}] if req.instructions is not None else []
    history: list[dict] = []
    if prev is not None:
        history = prev.messages[1:] if prev.instructions is not None else prev.messages
    open_calls = {c["id"] for m in history for c in m.get("tool_calls") or []}
    messages = system + history + input_messages(req, open_calls)
    tools = [{"type": "function", "function": t.model_dump(exclude={"type", "strict"}, exclude_none=True)}
             for t in req.tools or []]  # fmt: skip
    choice, name = req.tool_choice, None
    if isinstance(choice, FunctionChoice):
        choice, name = "tool", choice.name
    kwargs = template_kwargs(req, template)
    return ChatInput(messages, tools or None, choice, name, kwargs, None, req.parallel_tool_calls)


def build_prompt(
    chat: ChatInput,
    prev: StoredResponse | None,
    tokenizer: Any,
    template: TemplateInfo,
    max_len: int,
    auto_truncate: bool,
) -> ChatPrompt:
    """The prompt for ``chat``: continued from ``prev`` where it can be, else rendered (and, with
    ``truncation: auto``, with the oldest messages dropped until it fits ``max_len``)."""
    prompt = continued(chat, prev, tokenizer, template) if prev is not None else None
    if prompt is None:
        prompt = build_chat_prompt(chat, tokenizer, template)
    while auto_truncate and len(prompt.token_ids) >= max_len:
        shorter = drop_oldest(chat.messages)
        if shorter is None:
            break  # admission refuses it with the context error
        chat = chat._replace(messages=shorter)
        prompt = build_chat_prompt(chat, tokenizer, template)
    return prompt


def drop_oldest(messages: list[dict]) -> list[dict] | None:
    """Without the oldest turn after the system messages (and the tool results it left unanswered)."""
    keep = [m for m in messages if m["role"] == "system"]
    rest = [m for m in messages if m["role"] != "system"]
    if len(rest) <= 1:
        return None
    rest = rest[1:]
    while len(rest) > 1 and rest[0]["role"] == "tool":
        rest = rest[1:]
    return keep + rest


def continued(
    chat: ChatInput, prev: StoredResponse, tokenizer: Any, template: TemplateInfo
) -> ChatPrompt | None:
    """``prev``'s token sequence + the new messages as an append; None where that cannot be exact."""
    k = len(prev.messages)
    same = chat.messages[:k] == prev.messages and chat.tools == prev.tools
    if not same or chat.template_kwargs != prev.template_kwargs or prev.messages[-1]["role"] != "assistant":
        return None  # instructions, tools or thinking changed: the history itself renders differently
    stub = chat.messages[: k - 1] + [{"role": "assistant", "content": MARKER}] + chat.messages[k:]
    try:
        text = render_text(tokenizer, stub, chat.tools, template=template.source, **render_kwargs(chat))
    except Exception:  # the template refuses the stub (e.g. tool results after a turn without calls)
        return None
    parts = text.split(MARKER)
    if len(parts) != 2:
        return None
    tail = encode_text(tokenizer, parts[1], "input")
    ids = prev.token_ids
    if tail and tail[0] == ids[-1]:  # the turn ended on the end-of-turn token the template closes it with
        tail = tail[1:]
    # the diagnosis reads segments only inside rendered token ids: none here, the history is not re-rendered
    rendered = RenderedPrompt(text, [], segments=[])
    return prompt_from(chat, rendered, ids + tail, tokenizer, template)
