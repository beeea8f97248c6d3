"""Which request fields are ignored and which are refused.

Policy (also in docs/api.md): a field we do not know is ignored, so newer clients keep working.  A
field we know but cannot honour is refused with a 400 when its value would change the answer (an
ignored ``suffix`` or an audio modality would silently give the client something else); with a
value that changes nothing (``suffix: null``, ``best_of`` equal to ``n``) it is accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# field -> (value we can honour?, why we refuse otherwise)
REFUSED: dict[str, tuple[Callable[[Any, dict], bool], str]] = {
    "suffix": (lambda v, d: v in (None, ""), "suffix (insertion) is not supported"),
    "best_of": (
        lambda v, d: v is None or v == 1 or v == d.get("n", 1),
        "best_of other than n is not supported",
    ),
    "modalities": (lambda v, d: v is None or list(v) == ["text"], "only the text modality is supported"),
    "audio": (lambda v, d: v is None, "audio output is not supported"),
    "prediction": (lambda v, d: v is None, "predicted outputs are not supported"),
    "functions": (lambda v, d: v is None, "the legacy 'functions' field is not supported: use tools"),
    "function_call": (
        lambda v, d: v is None,
        "the legacy 'function_call' field is not supported: use tool_choice",
    ),
    "web_search_options": (lambda v, d: v is None, "web search is not supported"),
}


def refuse_unsupported(data: Any) -> Any:
    """A pydantic before-validator: raise (-> 400) for a known field we cannot honour."""
    if isinstance(data, dict):
        for name, (ok, why) in REFUSED.items():
            if name in data and not ok(data[name], data):
                raise ValueError(why)
    return data
