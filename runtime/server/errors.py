"""OpenAI-style error bodies, and the handlers that make every client mistake a 4xx, never a 500."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from runtime.engine import EngineError

log = logging.getLogger("kvreuse.server")


class APIError(Exception):
    """An error to return to the client as ``{"error": {message, type, param, code}}``."""

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


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(
        error_body(e.message, e.type, e.param, e.code), status_code=e.status, headers=e.headers
    )


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return f"malformed JSON body: {first.get('ctx', {}).get('error', 'invalid JSON')}", None
    msg = first.get("msg", "invalid value")
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    return (f"{param}: {msg}{more}" if param else f"{msg}{more}"), param


def install_error_handlers(app: FastAPI) -> None:
    """Map validation, engine and routing errors to OpenAI-shaped JSON with the right status."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(bad_request(message, param))

    @app.exception_handler(EngineError)
    async def _engine_error(_: Request, exc: EngineError) -> JSONResponse:
        return error_response(
            bad_request(str(exc), code="context_length_exceeded" if "exceeds" in str(exc) else None)
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(
            error_body(str(exc.detail), kind),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        # Only our own bugs land here; log them with the traceback, tell the client little.
        log.exception("internal error: %s", exc)
        return JSONResponse(error_body("internal server error", "server_error"), status_code=500)
