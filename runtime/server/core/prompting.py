"""From a chat request in neutral form (``ChatInput``) to prompt token ids: rendering, forced prefixes."""

from __future__ import annotations

from typing import Any, NamedTuple

from kvreuse.chat_templates.alternation import alternate
from kvreuse.chat_templates.parsers import THINK_OPEN
from kvreuse.chat_templates.render import RenderedPrompt, render
from kvreuse.runtime.loading.tokenizer import text_prompt_ids
from kvreuse.runtime.server.errors import bad_request
from kvreuse.runtime.server.templates import TemplateInfo, forced_tool_prefix


class ChatInput(NamedTuple):
    """A chat request as the core sees it, whichever protocol it came in.

    ``messages`` are template dicts (role, content, ``tool_calls`` as OpenAI-style function calls,
    ``reasoning_content``, ``tool_call_id``), already checked by the protocol; ``tools`` are
    ``{"type": "function", "function": {name, description, parameters}}`` as templates expect.
    ``tool_choice``: None or "auto" (free), "none" (no tool calls parsed), "required" (some tool),
    "tool" (the tool ``tool_name``): the last two are enforced by a grammar (``constraints.py``).
    ``reasoning_budget``: with a template that has reasoning, the reasoning is opened by the prompt
    (if the template did not) and closed after that many tokens (``reasoning_budget.py``).
    ``parallel_tool_calls`` False: at most one call, by the grammar (``constraints.py``).
    """

    messages: list[dict]
    tools: list[dict] | None = None
    tool_choice: str | None = None
    tool_name: str | None = None
    template_kwargs: dict[str, Any] | None = None
    reasoning_budget: int | None = None
    parallel_tool_calls: bool = True


class ChatPrompt(NamedTuple):
    """What the engine gets (``token_ids``) and what diagnostics and the output parser need."""

    messages: list[dict]
    tools: list[dict] | None
    rendered: RenderedPrompt
    token_ids: list[int]
    forced_prefix: str  # already part of token_ids; the parser sees it before the output
    tool_format: str | None  # None: tool calls are not parsed (no tools, or tool_choice "none")
    think_open: bool
    reasoning_budget: int | None = None  # reasoning tokens before it is closed (reasoning_budget.py)
    prefix_tokens: int = 0  # how many of token_ids are the forced prefix's
    # the conversation as the request gave it, where fitting it to the template changed it (``messages``
    # are what was rendered): what a stored response keeps, so a continuation re-fits the whole
    asked: list[dict] | None = None


def forced_tool(chat: ChatInput) -> str | None:
    """ "required", a tool name, or None when the model may answer without a call."""
    if not chat.tools or chat.tool_choice not in ("required", "tool"):
        return None
    return "required" if chat.tool_choice == "required" else chat.tool_name


HARMONY_EFFORTS = ("low", "medium", "high")


def effort_kwargs(template: TemplateInfo, effort: str | None, param: str) -> dict[str, Any]:
    """A request's reasoning effort as template variables: gpt-oss writes it into the system message
    (``Reasoning: high``), so a change of effort changes the prompt from its first message on."""
    if effort is None or template.harmony is None:
        return {}
    if effort not in HARMONY_EFFORTS:
        raise bad_request(f"{param} must be one of {', '.join(HARMONY_EFFORTS)} for this model", param)
    return {"reasoning_effort": effort}


def render_kwargs(chat: ChatInput) -> dict[str, Any]:
    """The template variables a request may set (never the ones rendering itself passes)."""
    kwargs = dict(chat.template_kwargs or {})
    for reserved in ("messages", "tools", "add_generation_prompt", "chat_template"):
        kwargs.pop(reserved, None)
    return kwargs


def build_chat_prompt(chat: ChatInput, tokenizer: Any, template: TemplateInfo) -> ChatPrompt:
    asked = chat.messages
    if template.alternating:  # roles fitted to the template (merged turns); ``messages`` say what rendered
        chat = chat._replace(messages=alternate(chat.messages, template.source))
    messages, tools, kwargs = chat.messages, chat.tools or None, render_kwargs(chat)
    try:
        rendered = render(tokenizer, messages, tools, template=template.source, **kwargs)
    except Exception as e:  # a template's raise_exception or a Jinja error on this input is the client's
        raise bad_request(
            f"the chat template cannot render these messages: {one_line(e)}", "messages"
        ) from None
    prompt = prompt_from(chat, rendered, list(rendered.token_ids), tokenizer, template)
    return prompt if messages is asked else prompt._replace(asked=asked)


def prompt_from(
    chat: ChatInput, rendered: RenderedPrompt, ids: list[int], tokenizer: Any, template: TemplateInfo
) -> ChatPrompt:
    """The prompt whose rendered conversation is ``ids`` (a fresh render's, or a stored sequence
    continued), with the forced tool-call or reasoning prefix the request's choices add."""
    tools = chat.tools or None
    tool_format = template.tool_format if tools and chat.tool_choice != "none" else None
    prefix = forced_tool_prefix(tool_format, forced_tool(chat))
    think_open = template.reasoning and rendered.text.rstrip().endswith(THINK_OPEN)
    budget = chat.reasoning_budget if template.reasoning else None
    if budget is not None:
        if prefix:
            raise bad_request("a reasoning budget cannot be combined with a tool choice that forces a call")
        if not think_open:
            prefix = THINK_OPEN + "\n"  # how reasoning models open it; the parser reads it as reasoning
    ids = list(ids)
    extra = encode_text(tokenizer, prefix, "tool_choice" if budget is None else "thinking") if prefix else []
    return ChatPrompt(
        chat.messages, tools, rendered, ids + extra, prefix, tool_format, think_open, budget, len(extra)
    )


def encode_text(tokenizer: Any, text: str, param: str, prompt: bool = False) -> list[int]:
    """Token ids of ``text`` (``prompt``: a whole raw prompt, with the tokenizer's leading BOS:
    ``text_prompt_ids``); a string the tokenizer cannot take (a lone surrogate, ...) is a 400."""
    try:
        return (
            text_prompt_ids(tokenizer, text) if prompt else tokenizer.encode(text, add_special_tokens=False)
        )
    except Exception as e:  # tokenizers raises TypeError for unencodable str, others their own
        raise bad_request(f"{param} cannot be tokenised: {one_line(e)}", param) from None


def one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__
