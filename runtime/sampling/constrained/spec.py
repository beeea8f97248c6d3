"""Grammar text for the constraints the API asks for: a JSON schema, any JSON object, a tool call.

A ``Grammar`` is plain hashable data (Lark source for llguidance), so it can sit in ``SamplingParams``
and key the compile cache; building one costs nothing and compiles nothing.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

# Compact, deterministic JSON (no free whitespace: a small model given free whitespace can loop on it),
# with the separators models are trained on.
JSON_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}

# What follows the forced prefix (runtime/server/templates.forced_tool_prefix) in each tool-call format.
CALL_FORMATS = {
    "hermes": ('", "arguments": ', "}\n</tool_call>"),
    "llama3": ('", "parameters": ', "}"),
}


class Grammar(NamedTuple):
    """Lark grammar source; ``label`` says what it was built from (logs, errors)."""

    source: str
    label: str


def closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` wherever an object lists its properties and says
    nothing about others (xgrammar's "strict mode", what OpenAI's strict outputs do).

    Every output still validates against the original schema; without this a small model keeps
    inventing keys until ``max_tokens`` cuts the JSON off.
    """
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        k: closed(v) if k not in ("enum", "const", "default", "examples", "required") else v
        for k, v in schema.items()
    }
    if "properties" in schema:
        out["properties"] = {k: closed(v) for k, v in schema["properties"].items()}
        out.setdefault("additionalProperties", False)
    return out


def _json_rule(schema: dict[str, Any]) -> str:
    schema = closed(schema)
    styled = {**schema, "x-guidance": {**JSON_STYLE, **schema.get("x-guidance", {})}}
    return "%json " + json.dumps(styled, sort_keys=True, ensure_ascii=False)


def _lit(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # a JSON string literal is a valid Lark string literal


def json_schema(schema: dict[str, Any]) -> Grammar:
    """The whole output is one JSON value valid against ``schema``."""
    return Grammar(f"start: value\nvalue: {_json_rule(schema)}\n", "json_schema")


def json_object() -> Grammar:
    """The whole output is one JSON object (``response_format: {"type": "json_object"}``)."""
    g = json_schema({"type": "object"})
    return g._replace(label="json_object")


def tool_call(
    tools: list[tuple[str, dict[str, Any] | None]], call_format: str, forced: str | None
) -> Grammar:
    """The rest of one tool call after the forced prefix: the name (one of ``tools``, unless the prefix
    already named ``forced``), the arguments valid against that tool's ``parameters``, the closing markup.
    """
    if call_format not in CALL_FORMATS:
        raise ValueError(f"no tool-call grammar for format {call_format!r}")
    mid, end = CALL_FORMATS[call_format]
    schemas = {name: params or {"type": "object"} for name, params in tools}
    if forced is not None:
        rules = [f"start: args_0 {_lit(end)}", f"args_0: {_json_rule(schemas[forced])}"]
        return Grammar("\n".join(rules) + "\n", f"tool {forced}")
    alts, rules = [], []
    for i, (name, schema) in enumerate(schemas.items()):
        alts.append(f"call_{i}")
        rules.append(f"call_{i}: {_lit(name + mid)} args_{i} {_lit(end)}")
        rules.append(f"args_{i}: {_json_rule(schema)}")
    return Grammar("start: " + " | ".join(alts) + "\n" + "\n".join(rules) + "\n", "tool_choice required")
