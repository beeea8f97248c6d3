"""Render OpenAI-style messages through a chat template, exactly as transformers does, with segments.

Rendering goes through transformers' public ``render_jinja_template`` (same sandboxed Jinja
environment, ``tojson``, ``raise_exception``, ``strftime_now``, loop controls, reasoning-field
aliasing), with the tokenizer's special tokens as template variables, and the text is tokenised
once with ``add_special_tokens=False`` -- the same steps as ``tokenizer.apply_chat_template``.

Besides the text and token ids, every rendering carries *segments* saying which part of the text
came from which message, the tool definitions, a ``<think>`` block, the generation prompt, or
template glue; ``template_check`` uses them to name where a prefix breaks.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from transformers.utils.chat_template_utils import render_jinja_template

from kvreuse.chat_templates.segments import find_segments

BUNDLED_TEMPLATES = ("chatml", "qwen3", "llama3", "qwen3_5", "gemma3", "gpt_oss")


class Segment(NamedTuple):
    """A span of the rendered prompt attributed to one source (message, tools, think block, glue)."""

    kind: str  # "tools" | "system" | "message" | "think" | "generation_prompt" | "template"
    message_index: int | None
    char_start: int
    char_end: int
    token_start: int
    token_end: int


class RenderedPrompt:
    """The rendered prompt text, its token ids and the segments covering it in order.

    Segments are attributed on first access: that renders the template again per message, which only
    a cache-miss diagnosis or a template check needs, so serving a request never pays for it.
    """

    __slots__ = ("text", "token_ids", "_segments", "_attribute")

    def __init__(
        self,
        text: str,
        token_ids: list[int],
        segments: list[Segment] | None = None,
        attribute: Callable[[], list[Segment]] | None = None,
    ) -> None:
        if segments is None and attribute is None:
            raise ValueError("a RenderedPrompt needs its segments or a way to attribute them")
        self.text, self.token_ids = text, token_ids
        self._segments, self._attribute = segments, attribute

    @property
    def segments(self) -> list[Segment]:
        if self._segments is None:
            assert self._attribute is not None
            self._segments, self._attribute = self._attribute(), None
        return self._segments

    def __repr__(self) -> str:
        return f"RenderedPrompt({len(self.text)} chars, {len(self.token_ids)} tokens)"


def load_template(name_or_path: str | None, tokenizer: Any) -> str:
    """Template source for ``None`` (the tokenizer's own), a bundled name, or a file path."""
    if name_or_path is None:
        return tokenizer.get_chat_template()
    if name_or_path in BUNDLED_TEMPLATES:
        return resources.files(__package__).joinpath("templates", f"{name_or_path}.jinja").read_text()
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path.read_text()
    raise ValueError(
        f"unknown chat template {name_or_path!r}: not a file; bundled names are {', '.join(BUNDLED_TEMPLATES)}"
    )


def _template_source(template: str | None, tokenizer: Any) -> str:
    # A string holding Jinja syntax is already a template; anything else names one.
    if template is not None and ("{%" in template or "{{" in template):
        return template
    return load_template(template, tokenizer)


def _normalize(messages: Sequence[dict], source: str = "") -> list[dict]:
    # Same as apply_chat_template: keys whose value is None are dropped, because templates test
    # for a key's presence (``'tool_calls' in message``) and would otherwise render "None".
    out = [{k: v for k, v in m.items() if v is not None} for m in messages]
    compact = source.replace(" ", "")
    # gpt-oss's writes them with tojson and no branch for a string (which would come out quoted)
    as_json = "arguments|tojson" in compact and "argumentsisstring" not in compact
    if "arguments|items" in compact or as_json:
        out = [_mapping_arguments(m) for m in out]
    if "message.thinking" in source and "reasoning_content" not in source:
        # gpt-oss's template reads an assistant turn's reasoning as ``thinking`` (transformers' name)
        out = [{("thinking" if k == "reasoning_content" else k): v for k, v in m.items()} for m in out]
    return out


def _mapping_arguments(message: dict) -> dict:
    """OpenAI sends tool-call arguments as a JSON string; XML-call templates (Qwen3.5, Qwen3-Coder)
    iterate them as a mapping (``arguments|items``) and gpt-oss's writes them with ``tojson`` only (a
    string would come out quoted), so a string holding a JSON object is decoded."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return message
    fixed = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        args = fn.get("arguments") if isinstance(fn, dict) else None
        if isinstance(args, str):
            try:
                decoded = json.loads(args or "{}")
            except ValueError:
                decoded = None
            if isinstance(decoded, dict):
                call = {**call, "function": {**fn, "arguments": decoded}}
        fixed.append(call)
    return {**message, "tool_calls": fixed}


def render_text(
    tokenizer: Any,
    messages: Sequence[dict],
    tools: list[dict] | None = None,
    *,
    template: str | None = None,
    add_generation_prompt: bool = True,
    **template_kwargs: Any,
) -> str:
    """Only the rendered text, as ``apply_chat_template(..., tokenize=False)`` returns it."""
    source = _template_source(template, tokenizer)
    kwargs = {**tokenizer.special_tokens_map, **template_kwargs}
    rendered, _ = render_jinja_template(
        conversations=[_normalize(messages, source)],
        tools=tools,
        chat_template=source,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
    return rendered[0]


def render(
    tokenizer: Any,
    messages: list[dict],
    tools: list[dict] | None = None,
    *,
    template: str | None = None,
    add_generation_prompt: bool = True,
    **template_kwargs: Any,
) -> RenderedPrompt:
    """Render and tokenise ``messages`` like ``apply_chat_template``, attributing spans to segments.

    ``template`` is a bundled name, a file path, Jinja source, or ``None`` for the tokenizer's own.
    """
    source = _template_source(template, tokenizer)

    def text_of(msgs: Sequence[dict], tls: list[dict] | None, gen: bool) -> str:
        return render_text(
            tokenizer, msgs, tls, template=source, add_generation_prompt=gen, **template_kwargs
        )

    text = text_of(messages, tools, add_generation_prompt)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    token_ids = list(enc["input_ids"])
    token_starts = [start for start, _ in enc["offset_mapping"]]
    # snapshots, so that a caller changing its lists later cannot change the attribution
    msgs, tls = copy.deepcopy(_normalize(messages)), copy.deepcopy(tools)

    def attribute() -> list[Segment]:
        spans = find_segments(text, msgs, tls, text_of, add_generation_prompt)
        return [
            Segment(kind, idx, cs, ce, _token_at(token_starts, cs), _token_at(token_starts, ce))
            for kind, idx, cs, ce in spans
        ]

    return RenderedPrompt(text, token_ids, attribute=attribute)


def _token_at(token_starts: list[int], char: int) -> int:
    # A token belongs to the segment holding its first character, so every token lands in exactly
    # one segment; this is the index of the first token starting at or after ``char``.
    lo, hi = 0, len(token_starts)
    while lo < hi:
        mid = (lo + hi) // 2
        if token_starts[mid] < char:
            lo = mid + 1
        else:
            hi = mid
    return lo


def locate(rendered: RenderedPrompt, token_index: int) -> Segment:
    """The segment holding token ``token_index``."""
    if not 0 <= token_index < len(rendered.token_ids):
        raise IndexError(f"token index {token_index} outside 0..{len(rendered.token_ids) - 1}")
    for seg in rendered.segments:
        if seg.token_start <= token_index < seg.token_end:
            return seg
    raise AssertionError("segments do not cover the tokens")  # find_segments covers all text


def locate_char(rendered: RenderedPrompt, char_index: int) -> Segment:
    """The segment holding character ``char_index`` (the last one for the end of the text)."""
    for seg in rendered.segments:
        if seg.char_start <= char_index < seg.char_end:
            return seg
    return rendered.segments[-1]


def describe(seg: Segment | None, messages: Sequence[dict]) -> str:
    """A segment in words, e.g. ``message 0 (system)``, ``think block (message 3)``, ``tools``.

    One wording for ``template-check`` and the server's cache diagnostics: a system message is a
    message like any other (named by its index and role), tool definitions are ``tools``.
    """
    if seg is None:
        return "end of prompt"
    idx = seg.message_index
    if seg.kind in ("message", "system") and idx is not None and 0 <= idx < len(messages):
        return f"message {idx} ({messages[idx].get('role')})"
    if seg.kind == "think":
        return f"think block (message {idx})" if idx is not None else "think block"
    return {"template": "template glue", "generation_prompt": "generation prompt"}.get(seg.kind, seg.kind)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of ``a`` and ``b`` (token ids, int arrays, or any items).

    The one longest-common-prefix in the project; vectorised for integers because the ideal-prefill
    accounting calls it for every pair of requests.
    """
    n = min(len(a), len(b))
    if n and isinstance(a[0], (int, np.integer)) and isinstance(b[0], (int, np.integer)):
        diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
        return int(diff[0]) if len(diff) else n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
