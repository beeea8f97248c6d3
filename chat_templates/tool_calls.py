"""Parsed-output types and the decoding of tool-call bodies (Hermes/Qwen3 JSON, Qwen3.5 XML, Llama 3)."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from typing import Any, NamedTuple


class ToolCall(NamedTuple):
    """One complete tool call, OpenAI-shaped: ``arguments`` is a JSON string."""

    id: str
    name: str
    arguments: str


class ToolCallDelta(NamedTuple):
    """A streamed tool call; kvreuse emits each call whole, once its markup has closed."""

    index: int
    id: str
    name: str
    arguments_delta: str


class ParsedDelta(NamedTuple):
    """What one chunk of model output adds to the visible answer, reasoning and tool calls."""

    content: str
    reasoning: str
    tool_calls: list[ToolCallDelta]


class ParsedOutput(NamedTuple):
    """A whole model output split into answer text, reasoning and tool calls."""

    content: str
    reasoning: str
    tool_calls: list[ToolCall]


class CallIds:
    """Tool-call ids ``call_<hex>``: derived from the request id when given, so they are reproducible."""

    def __init__(self, request_id: str | None) -> None:
        self._seed = request_id if request_id is not None else secrets.token_hex(16)

    def __call__(self, index: int) -> str:
        return "call_" + hashlib.sha256(f"{self._seed}:{index}".encode()).hexdigest()[:24]


def _arguments_json(value: Any) -> str:
    # Models sometimes emit arguments already encoded as a JSON string; keep those as written.
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _as_call(obj: Any, arg_keys: tuple[str, ...]) -> tuple[str, str] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    for key in arg_keys:
        if key in obj:
            return obj["name"], _arguments_json(obj[key])
    return obj["name"], "{}"


def parse_hermes_body(body: str) -> tuple[str, str] | None:
    """``(name, arguments_json)`` from the inside of ``<tool_call>...</tool_call>``, or None if malformed."""
    try:
        return _as_call(json.loads(body), ("arguments", "parameters"))
    except (ValueError, RecursionError):
        return None


_XML_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>\n?(.*?)</function>\s*", re.DOTALL)
_XML_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>\s*", re.DOTALL)


def _xml_value(text: str) -> Any:
    # The template writes mappings and lists as JSON and everything else as its string: read JSON
    # back where it parses (numbers, booleans, objects), keep the rest as the string it was.
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_qwen_xml_body(body: str) -> tuple[str, str] | None:
    """``(name, arguments_json)`` from ``<function=NAME><parameter=K>V</parameter>...</function>``
    (the inside of a Qwen3.5 / Qwen3-Coder ``<tool_call>``), or None if malformed."""
    m = _XML_FUNCTION.fullmatch(body)
    if m is None or not m.group(1).strip():
        return None
    inner, args, pos = m.group(2), {}, 0
    for p in _XML_PARAM.finditer(inner):
        if inner[pos : p.start()].strip():
            return None
        args[p.group(1).strip()] = _xml_value(p.group(2))
        pos = p.end()
    if inner[pos:].strip():
        return None
    return m.group(1).strip(), json.dumps(args, ensure_ascii=False)


def parse_llama3_calls(body: str) -> list[tuple[str, str]] | None:
    """Llama 3 JSON tool calls: one or more ``{"name", "parameters"}`` objects (``;``-separated), or None."""
    decoder = json.JSONDecoder()
    calls: list[tuple[str, str]] = []
    pos, text = 0, body.strip()
    try:
        while pos < len(text):
            obj, end = decoder.raw_decode(text, pos)
            call = _as_call(obj, ("parameters", "arguments"))
            if call is None or ("parameters" not in obj and "arguments" not in obj):
                return None
            calls.append(call)
            pos = end
            while pos < len(text) and text[pos] in "; \t\r\n":
                pos += 1
    except (ValueError, RecursionError):
        return None
    return calls or None
