"""``closed`` (strict-mode ``additionalProperties: false``) visits each schema node once: it used to close a
``properties`` map both as a schema and as a map, twice per nesting level, so a schema nested 30 objects
deep (well inside the body's depth limit) took 2^30 calls in a prep thread, holding the GIL."""

from __future__ import annotations

import jsonschema

from kvreuse.runtime.sampling.constrained import spec


def _nested(depth: int) -> dict:
    s: dict = {"type": "string"}
    for i in range(depth):
        s = {"type": "object", "properties": {f"k{i}": s, "n": {"type": "integer"}}, "required": [f"k{i}"]}
    return s


def test_closing_visits_each_node_once(monkeypatch):
    calls = []
    original = spec.closed

    def counting(schema):
        calls.append(1)
        return original(schema)

    monkeypatch.setattr(spec, "closed", counting)
    schema = _nested(16)
    out = spec.closed(schema)
    nodes = 1 + 16 * 3  # per level: the object, its two property schemas (the map itself is no schema)
    assert len(calls) <= 2 * nodes
    # every object is closed, and the original's instances still validate against the closed one
    inner = out
    for i in reversed(range(16)):
        assert inner["additionalProperties"] is False
        inner = inner["properties"][f"k{i}"]
    doc: object = "x"
    for i in range(16):
        doc = {f"k{i}": doc, "n": 1}
    jsonschema.validate(doc, schema)
    jsonschema.validate(doc, out)
