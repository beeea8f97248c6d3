"""The checks every HTTP request passes before routing, as one pure ASGI middleware.

Pure ASGI rather than ``@app.middleware("http")``: Starlette's ``BaseHTTPMiddleware`` hands the
app a receive channel of its own, so ``request.is_disconnected()`` never sees the client leave
and a non-streamed generation would run to the end for nobody.

* Host allow-list: a web page can point a DNS name it controls at 127.0.0.1 (DNS rebinding); the
  browser then sends that name as ``Host``, which a loopback server must refuse.
* POST bodies to our POST routes must be ``application/json``: browsers send ``text/plain`` / form posts cross-origin
  without a preflight, so requiring JSON means no web page can change state (cache reset) or
  spend compute; CORS stays closed unless ``--cors-allow-origin`` opens it.
* ``--max-request-bytes``: a body larger than this is refused before it is read whole: by its
  ``Content-Length``, or as soon as the bytes read pass it.
* POST bodies are read here, within ``body_timeout_s`` (408 after it): a client that holds its body
  open, or sends less than its ``Content-Length`` and half-closes, gets an answer instead of a
  handler waiting forever; the app then reads the body from memory.
* API keys (``--api-key``): the caller's tenant goes into ``request.state.tenant``, or a 401.
* Per-path, per-status request counts for ``/metrics``.

Every refusal is an ``APIError`` handed to ``on_error`` with the request's path and headers, so the
body has the shape of the protocol the caller speaks (the app decides which).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvreuse.runtime.server.errors import APIError

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


class _ClientGone(Exception):
    """The client went away before its body arrived: nobody to answer."""


def _host_name(value: str) -> str:
    """``Host`` header without port: ``[::1]:8000`` -> ``::1``, ``localhost:80`` -> ``localhost``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class RequestGuard:
    """ASGI middleware: host, content type and size checks, then counts ``/v1/`` responses."""

    def __init__(
        self,
        app: ASGIApp,
        allowed_hosts: Iterable[str],
        max_request_bytes: int,
        json_paths: Iterable[str],
        authenticate: Callable[[str, Headers], str | None],
        on_error: Callable[[str, Mapping[str, str], APIError], ASGIApp],
        count: Callable[[str, int], None],
        body_timeout_s: float = 30.0,
    ) -> None:
        self.app = app
        hosts = {h.strip().lower().strip("[]") for h in allowed_hosts}
        self.any_host = "*" in hosts
        self.allowed_hosts = hosts
        self.max_request_bytes = max_request_bytes
        self.json_paths = frozenset(json_paths)  # POST routes; other paths answer 404/405 as usual
        self.authenticate, self.on_error = authenticate, on_error  # tenant from the API key (tenants.py)
        self.count = count
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path = scope["path"]
        status = [500]

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            try:
                if (refusal := self._host_refusal(headers)) is not None:
                    raise refusal
                # request.state.tenant, read by the routes; a 401 before any other complaint
                scope.setdefault("state", {})["tenant"] = self.authenticate(path, Headers(scope=scope))
                if (refusal := self._body_refusal(scope, headers)) is not None:
                    raise refusal
                if scope["method"] == "POST" and path in self.json_paths:
                    receive = await self._read_body(receive)
            except APIError as e:
                await self.on_error(path, headers, e)(scope, receive, counted_send)
                return
            except _ClientGone:
                return
            await self.app(scope, receive, counted_send)
        finally:
            if path.startswith("/v1/"):
                self.count(path, status[0])

    async def _read_body(self, receive: Receive) -> Receive:
        """The whole body within the timeout and the size limit; returns a receive that replays it
        (then the client's own messages: a disconnect still reaches the handler)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout_s
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise APIError(
                    408, f"the request body did not arrive within {self.body_timeout_s:g} s", code="timeout"
                ) from None
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_request_bytes:  # a chunked body with no Content-Length, or one that lied
                raise self._too_large()
            if not message.get("more_body", False):
                break
        body, sent = b"".join(chunks), [False]

        async def replay() -> Message:
            if not sent[0]:
                sent[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay

    def _too_large(self) -> APIError:
        message = f"request body larger than {self.max_request_bytes} bytes (--max-request-bytes)"
        return APIError(413, message, code="too_large")

    def _host_refusal(self, headers: dict[str, str]) -> APIError | None:
        host = _host_name(headers.get("host", ""))
        if not self.any_host and host not in self.allowed_hosts:
            return APIError(400, "Host header not allowed (see --allowed-hosts)", code="invalid_host")
        return None

    def _body_refusal(self, scope: Scope, headers: dict[str, str]) -> APIError | None:
        if scope["method"] == "POST" and scope["path"] in self.json_paths:
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype != "application/json":
                message = "POST bodies must be sent with Content-Type: application/json"
                return APIError(415, message, code="unsupported_media_type")
            length = headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > self.max_request_bytes:
                return self._too_large()
        return None
