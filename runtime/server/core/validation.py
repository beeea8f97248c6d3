"""Request checks both protocols apply: JSON Schemas a tool or output format carries, stop-list size."""

from __future__ import annotations

from typing import Any

MAX_STOP = 16
JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


def check_schema(node: Any, where: str, depth: int = 0) -> None:
    """The structural rules of JSON Schema that templates and tool parsers rely on."""
    if depth > 32:
        raise ValueError(f"{where}: schema nested too deeply")
    if not isinstance(node, dict):
        raise ValueError(f"{where}: a schema must be an object")
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


def check_object_schema(v: dict[str, Any], where: str, label: str) -> dict[str, Any]:
    """A tool's parameters (``label`` names them in the message): a JSON Schema of type object."""
    if v.get("type", "object") != "object":
        raise ValueError(f"{label} must be a JSON Schema of type 'object'")
    check_schema(v, where)
    return v
