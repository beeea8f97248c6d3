"""Request checks both protocols apply: JSON Schemas a tool or output format carries, stop-list size."""

from __future__ import annotations

from typing import Any

MAX_STOP = 16
JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


SCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")  # keywords holding a list of subschemas
SCHEMA_MAPS = ("$defs", "definitions", "patternProperties", "dependentSchemas")  # name -> subschema
SCHEMA_ONE = ("not", "additionalProperties", "contains", "if", "then", "else", "propertyNames")


def check_schema(node: Any, where: str, depth: int = 0) -> None:
    """The structural rules of JSON Schema that templates, tool parsers and the grammar compiler rely
    on, in every subschema (combinators and definitions too: a malformed one there was a 500)."""
    if depth > 32:
        raise ValueError(f"{where}: schema nested too deeply")
    if not isinstance(node, dict):
        raise ValueError(f"{where}: a schema must be an object")
    if "x-guidance" in node and not isinstance(node["x-guidance"], dict):
        raise ValueError(f"{where}.x-guidance must be an object")
    for key in SCHEMA_LISTS:
        if key in node:
            if not isinstance(node[key], list):
                raise ValueError(f"{where}.{key} must be a list of schemas")
            for i, sub in enumerate(node[key]):
                _check_sub(sub, f"{where}.{key}[{i}]", depth)
    for key in SCHEMA_MAPS:
        if key in node:
            if not isinstance(node[key], dict):
                raise ValueError(f"{where}.{key} must be an object of schemas")
            for name, sub in node[key].items():
                _check_sub(sub, f"{where}.{key}.{name}", depth)
    for key in SCHEMA_ONE:
        if key in node:
            _check_sub(node[key], f"{where}.{key}", depth)
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    if not all(isinstance(k, str) and k in JSON_TYPES for k in kinds):
        raise ValueError(f"{where}.type: {kind!r} is not a JSON Schema type")
    props = node.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            raise ValueError(f"{where}.properties must be an object")
        for name, sub in props.items():
            check_schema(sub, f"{where}.properties.{name}", depth + 1)
    req = node.get("required")
    if req is not None and not (isinstance(req, list) and all(isinstance(r, str) for r in req)):
        raise ValueError(f"{where}.required must be a list of property names")
    if "items" in node and not isinstance(node["items"], bool):
        check_schema(node["items"], f"{where}.items", depth + 1)
    enum = node.get("enum")
    if enum is not None and not isinstance(enum, list):
        raise ValueError(f"{where}.enum must be a list")


def _check_sub(node: Any, where: str, depth: int) -> None:
    if not isinstance(node, bool):  # true / false are schemas too
        check_schema(node, where, depth + 1)


def check_object_schema(v: dict[str, Any], where: str, label: str) -> dict[str, Any]:
    """A tool's parameters (``label`` names them in the message): a JSON Schema of type object."""
    if v.get("type", "object") != "object":
        raise ValueError(f"{label} must be a JSON Schema of type 'object'")
    check_schema(v, where)
    return v
