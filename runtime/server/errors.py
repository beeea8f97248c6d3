"""OpenAI-style error bodies, and the handlers that make every client mistake a 4xx, never a 500."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from runtime.async_engine import EngineDead, RequestFailed
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
        return error_response(bad_request(str(exc), code=exc.code))

    @app.exception_handler(RequestFailed)
    async def _request_failed(_: Request, exc: RequestFailed) -> JSONResponse:
        log.error("%s", exc)  # our fault, not the client's, but only this request's
        return error_response(APIError(500, str(exc), type="server_error", code="request_failed"))

    @app.exception_handler(EngineDead)
    async def _engine_dead(_: Request, exc: EngineDead) -> JSONResponse:
        return error_response(APIError(503, str(exc), type="server_error", code="engine_dead"))

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


class _ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every 4xx/5xx body this server sends."""

    error: _ErrorDetail


_ERRORS = {
    "400": "invalid request (malformed JSON, a field of the wrong type or out of range, a prompt "
    "that does not fit, a Host header not allowed)",
    "404": "unknown model",
    "409": "the engine is busy (cache reset while requests run)",
    "413": "request body larger than --max-request-bytes",
    "415": "POST body not sent as application/json",
    "500": "the engine failed this request (a bug, never bad input)",
    "503": "overloaded (Retry-After), shutting down, or the engine stopped",
}


def document_errors(app: FastAPI, bodies: tuple[type[BaseModel], ...] = ()) -> None:
    """The OpenAPI schema lists the statuses the server really returns: FastAPI's default 422
    (validation) becomes our 400, every route documents the error body, and ``bodies`` (request
    models the routes parse themselves) get their schemas."""
    default_openapi = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = default_openapi()
        ref = {"$ref": "#/components/schemas/ErrorResponse"}
        defs = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        comps.update(defs.pop("$defs", {}))
        comps["ErrorResponse"] = defs
        for model in bodies:
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            comps.update(body.pop("$defs", {}))
            comps[model.__name__] = body
        for name in ("HTTPValidationError", "ValidationError"):
            comps.pop(name, None)
        for path, ops in schema.get("paths", {}).items():
            for method, op in ops.items():
                responses = op.setdefault("responses", {})
                responses.pop("422", None)
                codes = ["400", "500", "503"]
                if method == "post":
                    codes += ["413", "415"]
                if path in ("/v1/chat/completions", "/v1/completions"):
                    codes.append("404")
                if path == "/v1/cache/reset":
                    codes.append("409")
                for code in sorted(codes):
                    responses[code] = {
                        "description": _ERRORS[code],
                        "content": {"application/json": {"schema": ref}},
                    }
                if path == "/health":  # a health body, not an error body: {"status": "error", ...}
                    responses["503"]["content"]["application/json"]["schema"] = {"type": "object"}
                if path in ("/v1/chat/completions", "/v1/completions"):
                    ok = responses.setdefault("200", {"description": "OK"}).setdefault("content", {})
                    ok["text/event-stream"] = {"schema": {"type": "string"}}  # "stream": true
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
