"""Errors in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``, with its statuses."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi.responses import JSONResponse

from kvreuse.runtime.server.errors import APIError

# Our status -> Anthropic's error type; Anthropic answers overload with 529.
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
OVERLOADED = 529


def error_object(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": TYPES.get(status, "api_error"), "message": message}}


def error_response(e: APIError) -> JSONResponse:
    status = OVERLOADED if e.status == 503 else e.status
    return JSONResponse(error_object(status, e.message), status_code=status, headers=e.headers)


def is_anthropic(path: str, headers: Mapping[str, str]) -> bool:
    """Requests answered in Anthropic's error shape: the Messages routes, and the models routes when
    the caller is the Anthropic SDK (it always sends ``anthropic-version``)."""
    models = path == "/v1/models" or path.startswith("/v1/models/")
    return path.startswith("/v1/messages") or (models and "anthropic-version" in headers)
