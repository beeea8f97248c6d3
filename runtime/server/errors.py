"""Errors as data (``APIError``), and the handlers that make every client mistake a 4xx, never a 500.

The body's shape is the protocol's: ``install_error_handlers`` takes a ``render`` that picks it per
request (OpenAI's ``{"error": {...}}`` or Anthropic's ``{"type": "error", ...}``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvreuse.runtime.engine.async_engine import EngineDead, RequestFailed
from kvreuse.runtime.engine.engine import EngineError

log = logging.getLogger("kvreuse.server")


class APIError(Exception):
    """An error to return to the client: status, message, OpenAI-style ``type``/``param``/``code``
    (each protocol's renderer maps them to its own body)."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def engine_refusal(e: EngineError) -> APIError:
    """The client's error for a request the engine refused: a 400, or a 429 when the caller only
    has to wait (its own grammar is still compiling)."""
    if e.code == "grammar_busy":
        return APIError(429, str(e), type="rate_limit_error", code=e.code, headers={"Retry-After": "1"})
    return bad_request(str(e), code=e.code)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _union_tag(part: object) -> bool:
    """pydantic names the member of a union that failed in the error location (``constrained-str``,
    ``list[int]``); the client's field path is the rest."""
    return isinstance(part, str) and (part in _TYPE_TAGS or not part.isidentifier())


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _union_tag(p)]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return f"malformed JSON body: {first.get('ctx', {}).get('error', 'invalid JSON')}", None
    msg = first.get("msg", "invalid value")
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    return (f"{param}: {msg}{more}" if param else f"{msg}{more}"), param


Render = Callable[[str, Mapping[str, str], APIError], Response]  # (path, headers, error) -> response


def install_error_handlers(app: FastAPI, render: Render) -> None:
    """Map validation, engine and routing errors to ``APIError`` with the right status, answered
    in the shape ``render`` picks for the request."""

    def answer(request: Request, e: APIError) -> Response:
        return render(request.url.path, request.headers, e)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> Response:
        return answer(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        message, param = _validation_message(exc)
        return answer(request, bad_request(message, param))

    @app.exception_handler(EngineError)
    async def _engine_error(request: Request, exc: EngineError) -> Response:
        return answer(request, engine_refusal(exc))

    @app.exception_handler(RequestFailed)
    async def _request_failed(request: Request, exc: RequestFailed) -> Response:
        log.error("%s", exc)  # our fault, not the client's, but only this request's
        return answer(request, APIError(500, str(exc), type="server_error", code="request_failed"))

    @app.exception_handler(EngineDead)
    async def _engine_dead(request: Request, exc: EngineDead) -> Response:
        return answer(request, APIError(503, str(exc), type="server_error", code="engine_dead"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        code = "too_large" if exc.status_code == 413 else None
        headers = getattr(exc, "headers", None)
        return answer(
            request, APIError(exc.status_code, str(exc.detail), type=kind, code=code, headers=headers)
        )

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        # Only our own bugs land here; log them with the traceback, tell the client little.
        log.exception("internal error: %s", exc)
        return answer(request, APIError(500, "internal server error", type="server_error"))
