"""The Anthropic routes: ``POST /v1/messages``, ``POST /v1/messages/count_tokens``, and the
Anthropic shape of ``GET /v1/models`` and ``GET /v1/models/{id}``.  Every failure is an Anthropic-shaped 4xx (or a 529 for
overload), never a 500: the body is parsed and validated here, not by FastAPI's OpenAI-shaped handlers.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Awaitable
from datetime import datetime, timezone
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from runtime.engine.engine import EngineError
from runtime.server.anthropic import messages
from runtime.server.anthropic.convert import convert
from runtime.server.anthropic.errors import error_response
from runtime.server.anthropic.protocol import CountTokensRequest, MessagesRequest
from runtime.server.core.generate import generate
from runtime.server.core.prompting import build_chat_prompt
from runtime.server.errors import APIError, bad_request
from runtime.server.state import ServerState

MAX_BODY_BYTES = 32 * 2**20  # Anthropic's own limit for a Messages request


def check_model(state: ServerState, name: str | None) -> None:
    """The served names, or a name matching ``--model-alias`` (``claude-*`` by default), so that
    Claude Code's model names reach the local model; anything else is a 404."""
    if name is None or any(fnmatch.fnmatchcase(name, p) for p in state.config.model_aliases):
        return
    state.check_model(name)


async def _body(request: Request, model: type[BaseModel]) -> Any:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise APIError(413, f"request body of {len(raw)} bytes exceeds the {MAX_BODY_BYTES} byte limit")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"malformed JSON body: {e}") from None
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
        return error_response(bad_request(str(e)))


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
        body: MessagesRequest = await _body(request, MessagesRequest)
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
        body: CountTokensRequest = await _body(request, CountTokensRequest)
        check_model(state, body.model)
        chat = convert(body, state.config.keep_billing_header).chat
        prompt = build_chat_prompt(chat, state.tokenizer, state.template)
        return JSONResponse({"input_tokens": len(prompt.token_ids)})

    @app.post("/v1/messages")
    async def create_message(request: Request) -> Response:
        return await _shaped(create(request))

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        return await _shaped(count(request))
