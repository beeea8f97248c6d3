"""OpenAI-shaped error bodies, and the OpenAPI document's error statuses."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from kvreuse.runtime.server.errors import APIError


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(
        error_body(e.message, e.type, e.param, e.code), status_code=e.status, headers=e.headers
    )


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
    "401": "API keys are on and the request has no valid one",
    "403": "the key may not use this route (operator routes, the cache reset)",
    "404": "unknown model (the request's, or the one looked up), or a response id the caller has not stored",
    "408": "the request body did not arrive within --body-timeout",
    "409": "the engine is busy (cache reset while requests run)",
    "413": "request body larger than --max-request-bytes",
    "415": "POST body not sent as application/json",
    "429": "this key has too many requests in flight or being prepared, or a grammar still compiling",
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
                codes = ["400", "401", "403", "429", "500", "503"]
                if method == "post":
                    codes += ["408", "413", "415"]
                if path in ("/v1/chat/completions", "/v1/completions") or path.startswith(
                    ("/v1/models/", "/v1/responses")
                ):
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
                if path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
                    ok = responses.setdefault("200", {"description": "OK"}).setdefault("content", {})
                    ok["text/event-stream"] = {"schema": {"type": "string"}}  # "stream": true
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
