"""A request body parsed as JSON, refused with a 400 when it is malformed or nested too deep.

Python's parser recurses once per level: a 100,000-deep ``[[[...`` body raises ``RecursionError``
(a 500 before issue 39), and bodies merely a few thousand deep pass the parser but overflow the
recursive walks after it (pydantic, the schema closer, the chat template's ``tojson``).  No API body
needs more than ``MAX_DEPTH`` levels, so deeper ones are refused before anything walks them.
"""

from __future__ import annotations

import json
from typing import Any

from kvreuse.runtime.server.errors import bad_request

MAX_DEPTH = 100  # containers inside containers; a JSON schema of 40 nested anyOf levels still fits


def load_json(raw: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """The parsed body; a 400 (``APIError``) for malformed JSON or nesting past ``max_depth``."""
    too_deep = f"the JSON body is nested deeper than {max_depth} levels"
    try:
        obj = json.loads(raw)
    except RecursionError:
        raise bad_request(too_deep) from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise bad_request(f"malformed JSON body: {e}") from None
    if depth(obj, max_depth) > max_depth:
        raise bad_request(too_deep)
    return obj


def depth(obj: Any, stop: int) -> int:
    """Nesting depth of lists/dicts in ``obj`` (a scalar: 0), walked without recursion; stops
    counting once past ``stop``."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        value, d = stack.pop()
        if isinstance(value, dict):
            value = value.values()
        elif not isinstance(value, list):
            continue
        deepest = max(deepest, d)
        if d > stop:
            return d
        stack.extend((v, d + 1) for v in value if isinstance(v, (dict, list)))
    return deepest
