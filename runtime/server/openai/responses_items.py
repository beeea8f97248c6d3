"""``GET /v1/responses/{id}/input_items``: a stored response's input, as OpenAI lists it
(``responses.input_items.list`` in the official client).

The items are this request's own ``input`` (a string input is one user message), each with an id
(``msg_...``, or the call's own id), kept with the stored response. A cursor list: ``limit``
(1-100, default 20), ``order`` (``desc`` by default, as OpenAI's), ``after`` / ``before`` an item id.
"""

from __future__ import annotations

import uuid
from typing import Any

from kvreuse.runtime.server.errors import APIError
from kvreuse.runtime.server.openai.responses_protocol import ResponsesRequest


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input items as listed later, each with an id."""
    if isinstance(req.input, str):
        items: list[dict[str, Any]] = [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": req.input}]}
        ]
    else:
        items = [item.model_dump(exclude_none=True) for item in req.input]
    out = []
    for item in items:
        prefix = "msg" if item.get("type") == "message" else "item"
        out.append({"id": item.get("id") or f"{prefix}_{uuid.uuid4().hex[:24]}", **item})
    return out


def page(items: list[dict[str, Any]], limit: int, order: str, after: str | None, before: str | None) -> dict:
    """OpenAI's list object over ``items`` (in input order): the page after/before a cursor."""
    if not 1 <= limit <= 100:
        raise APIError(400, "limit must be between 1 and 100", param="limit", code="invalid_value")
    if order not in ("asc", "desc"):
        raise APIError(400, "order must be 'asc' or 'desc'", param="order", code="invalid_value")
    seq = items if order == "asc" else items[::-1]
    ids = [i["id"] for i in seq]
    for name, cursor in (("after", after), ("before", before)):
        if cursor is not None and cursor not in ids:
            raise APIError(404, f"No input item with id {cursor[:64]!r}.", param=name, code="not_found")
    lo = ids.index(after) + 1 if after is not None else 0
    hi = ids.index(before) if before is not None else len(seq)
    data = seq[lo:hi][:limit] if before is None else seq[lo:hi][-limit:]
    return {
        "object": "list", "data": data, "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": (lo + len(data) < hi) if before is None else (hi - len(data) > lo),
    }  # fmt: skip
