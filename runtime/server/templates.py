"""Which chat template the server renders with, and what output markup it implies."""

from __future__ import annotations

from typing import Any, NamedTuple

from chat_templates.render import load_template


class TemplateInfo(NamedTuple):
    """A template source plus the tool-call format and reasoning markup its model emits."""

    name: str
    source: str
    tool_format: str | None  # "hermes" | "qwen_xml" | "llama3" | None (no tool support)
    reasoning: bool


def resolve_template(tokenizer: Any, name: str | None) -> TemplateInfo:
    """``name`` None means the model's own template, except that a ChatML template without tool
    support is replaced by the bundled ChatML one (same turns, plus Hermes tools) so agents work."""
    source = load_template(name, tokenizer)
    label = name or "model"
    if name is None and "tools" not in source and "<|im_start|>" in source:
        source, label = load_template("chatml", tokenizer), "chatml (bundled; the model's own has no tools)"
    if "<tool_call>" in source and "<function=" in source:
        tool_format = "qwen_xml"  # Qwen3.5 / Qwen3-Coder: XML function and parameter tags
    elif "<tool_call>" in source:
        tool_format = "hermes"
    elif "<|python_tag|>" in source or "ipython" in source:
        tool_format = "llama3"
    else:
        tool_format = None
    return TemplateInfo(label, source, tool_format, "<think>" in source)


def forced_tool_prefix(tool_format: str | None, choice: str | None) -> str:
    """Text appended after the generation prompt so the model must answer with a tool call.

    ``choice`` is "required" or a function name.  Prefilling the start of the call (rather than
    adding an instruction to the conversation) keeps the cached prefix intact: it sits after
    the generation prompt, where the request's own tokens begin anyway.
    """
    if choice is None or tool_format is None:
        return ""
    if tool_format == "qwen_xml":
        return "<tool_call>\n<function=" if choice == "required" else f"<tool_call>\n<function={choice}>\n"
    if tool_format == "hermes":
        head = '<tool_call>\n{"name": "'
        return head if choice == "required" else f'{head}{choice}", "arguments": '
    head = '{"name": "'
    return head if choice == "required" else f'{head}{choice}", "parameters": '
