"""The Responses API routes: ``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}``,
``POST /v1/responses/{id}/cancel``, ``GET /v1/responses/{id}/input_items`` and ``POST /v1/responses/input_tokens``.

Every id is looked up in the caller's tenant only: another tenant's id is a 404, like an unknown one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request

from kvreuse.runtime.engine.states import records_budget
from kvreuse.runtime.server.core.generate import generate, parse_body
from kvreuse.runtime.server.errors import APIError
from kvreuse.runtime.server.fingerprint import system_fingerprint
from kvreuse.runtime.server.openai import responses_stream
from kvreuse.runtime.server.openai.responses_items import page
from kvreuse.runtime.server.openai.responses_prompt import build_prompt, chat_input
from kvreuse.runtime.server.openai.responses_protocol import ResponsesRequest
from kvreuse.runtime.server.openai.responses_run import ResponsesRun
from kvreuse.runtime.server.openai.responses_store import ResponseStore, pin_owner
from kvreuse.runtime.server.state import ServerState


def response_store(state: ServerState) -> ResponseStore:
    """In memory; with ``--kv-store``, persisted beside the pages (one file per model fingerprint)."""
    root = state.engine.config.kv_store
    if root is None:
        return ResponseStore()
    path = Path(root) / f"responses-{system_fingerprint(state.engine)}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return ResponseStore(path, max_bytes=records_budget(state.engine.config) // 2)  # //2: room to compact


def install_responses_routes(app: FastAPI, state: ServerState, openapi_body: dict[str, Any]) -> ResponseStore:
    store = response_store(state)
    state.faults["responses_store"] = store.error

    @app.post("/v1/responses", openapi_extra=openapi_body)
    async def create_response(request: Request) -> Any:
        body = await parse_body(state, request, ResponsesRequest)
        state.check_model(body.model)
        run = lambda caller: ResponsesRun(state, caller, body, store)  # noqa: E731
        return await generate(state, request, run, 1, body.stream, responses_stream)

    @app.post("/v1/responses/input_tokens", openapi_extra=openapi_body)
    async def input_tokens(request: Request) -> dict[str, Any]:
        body = await parse_body(state, request, ResponsesRequest)
        state.check_model(body.model)
        tenant = request.state.tenant

        def count() -> int:
            prev = None
            if body.previous_response_id is not None:
                prev = store.get(body.previous_response_id, tenant, "previous_response_id")
            chat = chat_input(body, state.template, prev)
            auto = body.truncation == "auto"
            limit = state.engine.max_model_len
            return len(build_prompt(chat, prev, state.tokenizer, state.template, limit, auto).token_ids)

        n = await state.prep.run(tenant, count)
        return {"object": "response.input_tokens", "input_tokens": n}

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request) -> dict[str, Any]:
        return store.get(response_id, request.state.tenant).body

    @app.get("/v1/responses/{response_id}/input_items")
    async def list_input_items(
        response_id: str, request: Request, limit: int = 20, order: str = "desc",
        after: str | None = None, before: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        return page(store.get(response_id, request.state.tenant).input_items, limit, order, after, before)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
        tenant = request.state.tenant
        store.delete(response_id, tenant)
        await state.on_engine(lambda e: e.cache.unpin(pin_owner(tenant, response_id)))
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str, request: Request) -> dict[str, Any]:
        tenant = request.state.tenant
        run = store.run_of(response_id, tenant)
        if run is None:
            store.get(response_id, tenant)  # unknown or foreign: 404
            raise APIError(400, f"response {response_id!r} has finished: only a response being generated "
                           "can be cancelled", param="response_id", code="response_not_running")  # fmt: skip
        run.cancel()
        return {**run.body([]), "status": "cancelled"}

    return store
