"""Grammar text for the constraints the API asks for: a JSON schema, any JSON object, a tool call.

A ``Grammar`` is plain hashable data (Lark source for llguidance), so it can sit in ``SamplingParams``
and key the compile cache; building one costs nothing and compiles nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

# Compact, deterministic JSON (no free whitespace: a small model given free whitespace can loop on it),
# with the separators models are trained on.
JSON_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


def _lit(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # a JSON string literal is a valid Lark string literal


# What follows the forced prefix (runtime/server/templates.forced_tool_prefix) in each tool-call format:
# Lark between the tool's name and its arguments, and after them.  Harmony's markers are special
# tokens, written bare (llguidance matches <|name|> to that token; quoted, it would be plain text).
CALL_FORMATS = {
    "hermes": (_lit('", "arguments": '), _lit("}\n</tool_call>")),
    "llama3": (_lit('", "parameters": '), _lit("}")),
    "harmony": ('<|channel|> "commentary " <|constrain|> "json" <|message|>', "<|call|>"),
}
# How a call opens (the forced prefix of "required") and what goes between two calls, for the formats
# whose parser reads several calls; a format missing here gets one call and no free-text grammar.
CALL_OPEN = {"hermes": '<tool_call>\n{"name": "'}
CALL_PREFIX = {"llama3": '{"name": "'}  # how a Llama 3 call opens: it is the whole message, not a tag
CALL_SEPARATOR = {"hermes": "\n"}


class Grammar(NamedTuple):
    """Lark grammar source; ``label`` says what it was built from (logs, errors).  ``free_text``: the
    grammar admits prose, which the matcher's wrap-up (closing the JSON near ``max_tokens``) would
    fill with quotes, so it has none."""

    source: str
    label: str
    free_text: bool = False


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
    out = {  # "properties" is a map of schemas, not a schema: closed below, once (not twice per level)
        k: closed(v) if k not in ("enum", "const", "default", "examples", "required", "properties") else v
        for k, v in schema.items()
    }
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {k: closed(v) for k, v in schema["properties"].items()}
        out.setdefault("additionalProperties", False)
    return out


def _json_rule(schema: dict[str, Any]) -> str:
    schema = closed(schema)
    extra = schema.get("x-guidance", {})
    if not isinstance(extra, dict):
        raise ValueError(f"x-guidance must be an object, got {type(extra).__name__}")
    styled = {**schema, "x-guidance": {**JSON_STYLE, **extra}}
    return "%json " + json.dumps(styled, sort_keys=True, ensure_ascii=False)


def json_schema(schema: dict[str, Any]) -> Grammar:
    """The whole output is one JSON value valid against ``schema``."""
    return Grammar(f"start: value\nvalue: {_json_rule(schema)}\n", "json_schema")


def json_object() -> Grammar:
    """The whole output is one JSON object (``response_format: {"type": "json_object"}``)."""
    g = json_schema({"type": "object"})
    return g._replace(label="json_object")


def tool_call(
    tools: list[tuple[str, dict[str, Any] | None]],
    call_format: str,
    forced: str | None,
    parallel: bool = False,
    name_ids: Mapping[str, list[int]] | None = None,
) -> Grammar:
    """The rest of a forced tool call after the forced prefix: the name (one of ``tools``, unless the prefix
    already named ``forced``), the arguments valid against that tool's ``parameters``, the closing markup;
    with ``parallel`` (where the format separates calls) further calls of the same kind may follow.
    """
    if call_format not in CALL_FORMATS:
        raise ValueError(f"no tool-call grammar for format {call_format!r}")
    mid, end = CALL_FORMATS[call_format]
    schemas = {name: params or {"type": "object"} for name, params in tools}
    if forced is not None:
        rules = [f"first: args_0 {end}", f"args_0: {_json_rule(schemas[forced])}",
                 f"call: {_named(forced, mid)} args_0 {end}"]  # fmt: skip
        label = f"tool {forced}"
    else:
        alts, rules = [], []
        for i, (name, schema) in enumerate(schemas.items()):
            alts.append(f"call_{i}")
            rules.append(f"call_{i}: {_named(name, mid, name_ids)} args_{i} {end}")
            rules.append(f"args_{i}: {_json_rule(schema)}")
        rules += ["first: call", "call: " + " | ".join(alts)]
        label = "tool_choice required"
    more = parallel and call_format in CALL_SEPARATOR
    nxt = _lit(CALL_SEPARATOR.get(call_format, "") + CALL_OPEN.get(call_format, ""))
    start = f"start: first ({nxt} call)*" if more else "start: first"
    return Grammar(start + "\n" + "\n".join(rules) + "\n", label + (" (parallel)" if more else ""))


def at_most_one_call(tools: list[tuple[str, dict[str, Any] | None]], call_format: str) -> Grammar | None:
    """Free text, or one tool call (after free text where the format has text before a call), then the
    end: ``tool_choice`` auto without parallel calls.  None for a format this does not know."""
    any_ = "(?s:.*)"
    if call_format == "llama3":
        # a Llama 3 call is the whole message (the parser reads one that starts with "{" as calls,
        # and calls after <|python_tag|>): text that does neither, or one call
        rules = [
            "start: TEXT | OPEN call",
            f"TEXT: /{any_}/ & ~/\\s*\\{{{any_}/ & ~/{any_}{_regex_lit('<|python_tag|>')}{any_}/",
            f"OPEN: /\\s*{_regex_lit(CALL_PREFIX['llama3'])}/",
        ]
        return _one_call("\n".join(rules + _call_rules(tools, call_format)))
    if call_format == "qwen_xml":
        # the parameters are XML the template writes, with no grammar here: the call names a tool and
        # ends at the first </tool_call>, after which nothing follows
        close = _regex_lit("</tool_call>")
        rules = [
            "start: TEXT | PRE call",
            *_text_or_pre("<tool_call>", "<tool_call>\n<function="),
            f"BODY: /{any_}{close}/ & ~/{any_}{close}(?s:.+)/",
            "call: " + " | ".join(_lit(name + ">") + " BODY" for name, _ in tools),
        ]
        return _one_call("\n".join(rules))
    if call_format not in CALL_OPEN:
        return None
    opening = CALL_OPEN[call_format]
    rules = ["start: TEXT | PRE call", *_text_or_pre(opening.split("\n", 1)[0], opening)]
    return _one_call("\n".join(rules + _call_rules(tools, call_format)))


def _named(name: str, mid: str, name_ids: Mapping[str, list[int]] | None = None) -> str:
    """A tool's name and what follows it: one literal where ``mid`` is one (a single lexeme).  Harmony
    (the forced prefix ends at "functions", before the dot): ``.NAME`` as ``name_ids`` gives its token
    ids, so the model writes the name as the rendered history will tokenise it, and the next request
    reuses the call's cached tokens (any other spelling of the same text would be allowed otherwise)."""
    if mid.startswith('"') and mid.endswith('"'):
        return _lit(name + json.loads(mid))
    if name_ids and name in name_ids:
        return " ".join(f"<[{t}]>" for t in name_ids[name]) + " " + mid
    return f"{_lit('.' + name)} {mid}"


def _one_call(source: str) -> Grammar:
    return Grammar(source + "\n", "at most one tool call", free_text=True)


def _text_or_pre(marker: str, opening: str) -> list[str]:
    """TEXT: free text without ``marker``; PRE: free text, then ``opening`` (which starts with ``marker``).

    One lexeme for "text, then the opening": a text lexeme that stopped before the marker cannot be
    taken back by the lexer, so the choice between the two is made on the marker itself."""
    any_, m = "(?s:.*)", _regex_lit(marker)
    return [
        f"TEXT: /{any_}/ & ~/{any_}{m}{any_}/",
        f"PRE: /{any_}{_regex_lit(opening)}/ & ~/{any_}{m}{any_}{m}{any_}/",
    ]


def _call_rules(tools: list[tuple[str, dict[str, Any] | None]], call_format: str) -> list[str]:
    """``call``: one of ``tools`` by name, its arguments valid against its parameters, the closing markup."""
    mid, end = CALL_FORMATS[call_format]
    rules, alts = [], []
    for i, (name, schema) in enumerate(tools):
        alts.append(f"call_{i}")
        rules.append(f"call_{i}: {_named(name, mid)} args_{i} {end}")
        rules.append(f"args_{i}: {_json_rule(schema or {'type': 'object'})}")
    return [*rules, "call: " + " | ".join(alts)]


def _regex_lit(s: str) -> str:
    # only the metacharacters: the regex crate reads an escaped "<" or ">" as a word boundary
    return "".join("\\n" if c == "\n" else "\\" + c if c in _REGEX_META else c for c in s)


_REGEX_META = set('\\.+*?()|[]{}^$#&-~/"')
