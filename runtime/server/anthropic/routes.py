"""The Anthropic routes: ``POST /v1/messages``, ``POST /v1/messages/count_tokens``, and the
Anthropic shape of ``GET /v1/models`` and ``GET /v1/models/{id}``.  Every failure is an Anthropic-shaped 4xx (or a 529 for
overload), never a 500: the body is parsed and validated here, not by FastAPI's OpenAI-shaped handlers.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Awaitable
from datetime import datetime, timezone
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from kvreuse.runtime.engine.engine import EngineError
from kvreuse.runtime.server.anthropic import messages
from kvreuse.runtime.server.anthropic.convert import convert
from kvreuse.runtime.server.anthropic.errors import error_response
from kvreuse.runtime.server.anthropic.protocol import CountTokensRequest, MessagesRequest
from kvreuse.runtime.server.body import load_json
from kvreuse.runtime.server.core.generate import generate
from kvreuse.runtime.server.core.prompting import build_chat_prompt
from kvreuse.runtime.server.errors import APIError, bad_request, engine_refusal
from kvreuse.runtime.server.state import ServerState

MAX_BODY_BYTES = 32 * 2**20  # Anthropic's own limit for a Messages request
BODIES = (MessagesRequest, CountTokensRequest)  # the request models the OpenAPI schema documents


def check_model(state: ServerState, name: str | None) -> None:
    """The served names, or a name matching ``--model-alias`` (``claude-*`` by default), so that
    Claude Code's model names reach the local model; anything else is a 404."""
    if name is None or any(fnmatch.fnmatchcase(name, p) for p in state.config.model_aliases):
        return
    state.check_model(name)


async def _body(state: ServerState, request: Request, model: type[BaseModel]) -> Any:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise APIError(413, f"request body of {len(raw)} bytes exceeds the {MAX_BODY_BYTES} byte limit")
    return await state.prep.run(request.state.tenant, _validate, state, raw, model)


def _validate(state: ServerState, raw: bytes, model: type[BaseModel]) -> Any:
    """Parse and validate off the event loop (a prep thread): a 100,000-message body costs it nothing."""
    data = load_json(raw)
    if isinstance(data, dict):
        state.check_messages(data.get("messages"))  # what cannot fit, before pydantic walks it
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        more = f" (and {e.error_count() - 1} more errors)" if e.error_count() > 1 else ""
        raise bad_request(
            f"{loc}: {first.get('msg')}{more}" if loc else f"{first.get('msg')}{more}"
        ) from None


async def _shaped(work: Awaitable[Response]) -> Response:
    try:
        return await work
    except APIError as e:
        return error_response(e)
    except EngineError as e:  # prompt too long for the context, and the like
        return error_response(engine_refusal(e))


def model_object(state: ServerState, model_id: str | None = None) -> dict[str, Any]:
    """Anthropic's model object; ``model_id`` (a served name or an alias) is the id asked about."""
    name = state.config.served_model_name
    created = datetime.fromtimestamp(state.created, timezone.utc).isoformat().replace("+00:00", "Z")
    return {"type": "model", "id": model_id or name, "display_name": name, "created_at": created}


def models_page(state: ServerState) -> dict[str, Any]:
    card = model_object(state)
    return {"data": [card], "has_more": False, "first_id": card["id"], "last_id": card["id"]}


def model_lookup(state: ServerState, model_id: str) -> dict[str, Any]:
    check_model(state, model_id)  # served names and aliases; else a 404 (not_found_error)
    return model_object(state, model_id)


def install_anthropic_routes(app: FastAPI, state: ServerState) -> None:
    async def create(request: Request) -> Response:
        body: MessagesRequest = await _body(state, request, MessagesRequest)
        check_model(state, body.model)
        conv = convert(body, state.config.keep_billing_header)
        return await generate(
            state,
            request,
            lambda caller: messages.MessagesRun(state, caller, body, conv),
            1,
            body.stream,
            messages,
        )

    async def count(request: Request) -> Response:
        body: CountTokensRequest = await _body(state, request, CountTokensRequest)
        check_model(state, body.model)

        def tokens() -> int:  # rendering is CPU work: off the event loop, in the caller's prep share
            chat = convert(body, state.config.keep_billing_header).chat
            return len(build_chat_prompt(chat, state.tokenizer, state.template).token_ids)

        return JSONResponse({"input_tokens": await state.prep.run(request.state.tenant, tokens)})

    def body(model: type[BaseModel]) -> dict[str, Any]:  # documented for clients and schemathesis
        ref = {"$ref": f"#/components/schemas/{model.__name__}"}
        return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}

    @app.post("/v1/messages", openapi_extra=body(MessagesRequest))
    async def create_message(request: Request) -> Response:
        return await _shaped(create(request))

    @app.post("/v1/messages/count_tokens", openapi_extra=body(CountTokensRequest))
    async def count_tokens(request: Request) -> Response:
        return await _shaped(count(request))
