"""Which chat template the server renders with, and what output markup it implies."""

from __future__ import annotations

from typing import Any, NamedTuple

from kvreuse.chat_templates.alternation import requires_alternation
from kvreuse.chat_templates.render import load_template
from kvreuse.runtime.loading.harmony_vocab import harmony_encoding

# harmony's call header, as the model writes it after ``<|start|>assistant`` (and as openai-harmony and
# the bundled template's append-only mode render a call in history)
# (the prefix of "required" stops before the dot: " to=functions." would tokenise as one piece where the
# rendered history has "functions" + ".get_...")
HARMONY_CALL = " to=functions"
HARMONY_ARGS = "<|channel|>commentary <|constrain|>json<|message|>"


class TemplateInfo(NamedTuple):
    """A template source plus the tool-call format and reasoning markup its model emits."""

    name: str
    source: str
    tool_format: str | None  # "hermes" | "qwen_xml" | "llama3" | "harmony" | None (no tool support)
    reasoning: bool  # <think> markup in the text
    harmony: Any = None  # gpt-oss: openai-harmony's encoding (the parser reads token ids), else None
    # roles must alternate user/assistant (Gemma's): conversations are fitted to it before rendering
    # (chat_templates/alternation.py)
    alternating: bool = False


# a checkpoint without a chat template (a GGUF converted without one: Gemma 3 270M's) renders with the
# bundled template of its architecture
BUNDLED_FOR = {"gemma3": "gemma3", "gemma3_text": "gemma3", "gpt_oss": "gpt_oss", "qwen3": "qwen3",
               "qwen3_moe": "qwen3", "qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5"}  # fmt: skip


class NoChatTemplate(ValueError):
    """The model has no chat template and none is bundled for its architecture; the message names
    ``--chat-template``."""


def resolve_template(tokenizer: Any, name: str | None, model_type: str = "") -> TemplateInfo:
    """``name`` None means the model's own template, except that a ChatML template without tool
    support is replaced by the bundled ChatML one (same turns, plus Hermes tools) so agents work,
    and a model without one gets the bundled template of its ``model_type`` (else ``NoChatTemplate``)."""
    label = name or "model"
    if name is None and not getattr(tokenizer, "chat_template", None):
        name = BUNDLED_FOR.get(model_type)
        if name is None:
            raise NoChatTemplate(
                f"the model ({model_type or 'unknown architecture'}) has no chat template and none is "
                "bundled for it: pass --chat-template (chatml, llama3, ... or a .jinja file)"
            )
        label = f"{name} (bundled; the model has none)"
    source = load_template(name, tokenizer)
    if name is None and "tools" not in source and "<|im_start|>" in source:
        source, label = load_template("chatml", tokenizer), "chatml (bundled; the model's own has no tools)"
    if is_harmony(source):
        return TemplateInfo(label, source, "harmony", False, harmony_encoding())
    if "<tool_call>" in source and "<function=" in source:
        tool_format = "qwen_xml"  # Qwen3.5 / Qwen3-Coder: XML function and parameter tags
    elif "<tool_call>" in source:
        tool_format = "hermes"
    elif "<|python_tag|>" in source or "ipython" in source:
        tool_format = "llama3"
    else:
        tool_format = None
    return TemplateInfo(label, source, tool_format, "<think>" in source, None, requires_alternation(source))


def forced_tool_prefix(tool_format: str | None, choice: str | None) -> str:
    """Text appended after the generation prompt so the model must answer with a tool call.

    ``choice`` is "required" or a function name.  Prefilling the start of the call (rather than
    adding an instruction to the conversation) keeps the cached prefix intact: it sits after
    the generation prompt, where the request's own tokens begin anyway.
    """
    if choice is None or tool_format is None:
        return ""
    if tool_format == "harmony":
        return HARMONY_CALL if choice == "required" else f"{HARMONY_CALL}.{choice}{HARMONY_ARGS}"
    if tool_format == "qwen_xml":
        return "<tool_call>\n<function=" if choice == "required" else f"<tool_call>\n<function={choice}>\n"
    if tool_format == "hermes":
        head = '<tool_call>\n{"name": "'
        return head if choice == "required" else f'{head}{choice}", "arguments": '
    head = '{"name": "'
    return head if choice == "required" else f'{head}{choice}", "parameters": '


def is_harmony(source: str) -> bool:
    """gpt-oss's template: messages in channels, headers of special tokens."""
    return "<|channel|>" in source and "<|start|>" in source
