"""``--record FILE``: every HTTP exchange the server answers, one JSON line each (benchmarks: what a
real agent sent, request by request, and what the server's cache made of it).

A line: ``seq`` (arrival order), ``t`` (arrival, seconds since the first), ``method``, ``path``,
``status``, ``request`` (the parsed JSON body, or None), and ``result``: the final usage and the
``kvreuse`` extension (cache figures, the break's diagnosis) read from the JSON response or from the
stream's last event that carries them.  Pure ASGI: it sees the bytes as they pass and changes none.
Records hold prompts verbatim: a file for benchmarks on loopback, scrubbed before it is kept.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any


def final_figures(body: bytes) -> dict[str, Any]:
    """The last ``usage`` and ``kvreuse`` objects in a JSON body or an SSE stream (Anthropic's
    ``message_delta``, Responses' ``response.completed``, chat completions' last chunk)."""
    text = body.decode("utf-8", "replace")
    docs = [text] if not text.lstrip().startswith(("event:", "data:")) else [
        line[5:].strip() for line in text.splitlines() if line.startswith("data:")
    ]  # fmt: skip
    out: dict[str, Any] = {}
    for doc in docs:
        try:
            obj = json.loads(doc)
        except ValueError:
            continue
        for node in (
            obj,
            obj.get("response") if isinstance(obj, dict) else None,
            (obj.get("message") if isinstance(obj, dict) else None),
            (obj.get("delta") if isinstance(obj, dict) else None),  # Anthropic's message_delta: stop_reason
        ):
            if isinstance(node, dict):
                for key in ("usage", "kvreuse", "stop_reason", "status"):
                    if node.get(key) is not None:
                        out[key] = node[key]
        if (
            isinstance(obj, dict)
            and obj.get("type") == "error"
            or (isinstance(obj, dict) and "error" in obj and obj["error"])
        ):
            out["error"] = obj.get("error")
    return out


class RequestRecorder:
    """ASGI middleware writing one line per exchange to ``path`` (appended; thread-safe)."""

    def __init__(self, app: Any, path: str | Path) -> None:
        self.app, self.path = app, Path(path)
        self._lock = threading.Lock()
        self._seq = 0
        self._t0: float | None = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        with self._lock:
            seq, self._seq = self._seq, self._seq + 1
            now = time.monotonic()
            self._t0 = now if self._t0 is None else self._t0
        sent_in, sent_out, status = bytearray(), bytearray(), [0]

        async def rx() -> dict:
            msg = await receive()
            if msg["type"] == "http.request":
                sent_in.extend(msg.get("body", b""))
            return msg

        async def tx(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            elif msg["type"] == "http.response.body":
                sent_out.extend(msg.get("body", b""))
            await send(msg)

        try:
            await self.app(scope, rx, tx)
        finally:
            self.write(seq, now - self._t0, scope, status[0], bytes(sent_in), bytes(sent_out))

    def write(self, seq: int, t: float, scope: dict, status: int, body: bytes, answer: bytes) -> None:
        try:
            request = json.loads(body) if body else None
        except ValueError:
            request = None
        line = {"seq": seq, "t": round(t, 3), "method": scope["method"], "path": scope["path"],
                "query": scope.get("query_string", b"").decode("latin-1"), "status": status,
                "request": request, "result": final_figures(answer)}  # fmt: skip
        with self._lock, self.path.open("a") as f:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
