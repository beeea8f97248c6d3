"""The FastAPI application: routes, admission around each generation, client-disconnect handling."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ValidationError

from runtime.async_engine import AsyncEngine
from runtime.engine import EngineError
from runtime.server import chat, completions
from runtime.server.anthropic.routes import install_anthropic_routes, models_page
from runtime.server.cache_routes import install_cache_routes
from runtime.server.errors import (
    APIError,
    bad_request,
    document_errors,
    error_response,
    install_error_handlers,
)
from runtime.server.guard import RequestGuard
from runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from runtime.server.state import ServerConfig, ServerState
from runtime.server.streaming import Once, guarded_events, openai_error_events

DISCONNECT_POLL_S = 0.25
# bodiless POSTs still say application/json (see guard.py); the body itself is ignored
JSON_OBJECT_BODY = {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}


async def _unless_disconnected(request: Request, work: Awaitable[dict[str, Any]]) -> dict[str, Any] | None:
    """Await ``work``; if the client goes away first, cancel it (which aborts the engine requests)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                return None
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


M = TypeVar("M", bound=BaseModel)


async def _parse(
    state: ServerState, request: Request, model: type[M], precheck: Callable[[Any], None] | None = None
) -> M:
    """The validated body, parsed and validated in the prep thread: a 16,000-message body costs the
    event loop nothing, and ``precheck`` refuses what cannot fit before pydantic walks all of it."""
    raw = await request.body()

    def parse() -> M:
        try:
            obj = json.loads(raw)
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise bad_request(f"malformed JSON body: {e}") from None
        if precheck is not None:
            precheck(obj)
        try:
            return model.model_validate(obj)
        except ValidationError as e:
            raise RequestValidationError(e.errors()) from None

    return await asyncio.get_running_loop().run_in_executor(state.prep, parse)


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI for a body we parse ourselves (``_parse``); ``document_errors`` adds the schema."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


async def _generate(
    state: ServerState, request: Request, make_run: Callable[[], Any], n: int, stream: bool, module: Any
) -> Response:
    tenant = request.state.tenant
    state.tenants.admit(tenant, n)
    try:
        state.admit(n)  # before the render, so at most the server's capacity of renders is ever queued
    except APIError:
        state.tenants.release(tenant, n)
        raise

    def _release() -> None:
        state.release(n)
        state.tenants.release(tenant, n)

    release = Once(_release)
    try:
        # template rendering and tokenisation are CPU work: off the event loop, so /health and
        # every other request keep being answered while a big prompt is prepared
        run = await asyncio.get_running_loop().run_in_executor(state.prep, make_run)
    except BaseException:
        release()
        raise
    session = getattr(run.req, "user", None) or request.headers.get("x-session-id")
    run.scope = state.tenants.scope(tenant, session, state.tenants.public_len(getattr(run, "prompt", None)))
    if stream:
        return guarded_events(
            module.stream_events(run), run.id, release, getattr(module, "error_events", openai_error_events)
        )
    try:
        body = await _unless_disconnected(request, module.complete(run))
    finally:
        release()
    return JSONResponse(body) if body is not None else Response(status_code=499)


def create_app(
    aengine: AsyncEngine, config: ServerConfig, on_shutdown: Callable[[], None] | None = None
) -> FastAPI:
    """An app serving ``aengine``; ``on_shutdown`` runs after the last request (e.g. stop the engine)."""
    state = ServerState(aengine, config)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        state.prep.shutdown(wait=False, cancel_futures=True)
        if on_shutdown is not None:
            on_shutdown()

    app = FastAPI(title="kvreuse", version="0.1.0", lifespan=lifespan)
    app.state.kv = state
    install_error_handlers(app)

    def count_messages(obj: Any) -> None:
        if isinstance(obj, dict) and isinstance(obj.get("messages"), list):
            state.check_messages(len(obj["messages"]))

    @app.post("/v1/chat/completions", openapi_extra=json_body(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        body = await _parse(state, request, ChatCompletionRequest, count_messages)
        state.check_model(body.model)
        return await _generate(state, request, lambda: chat.ChatRun(state, body), body.n, body.stream, chat)

    @app.post("/v1/completions", openapi_extra=json_body(CompletionRequest))
    async def text_completions(request: Request) -> Response:
        body = await _parse(state, request, CompletionRequest)
        state.check_model(body.model)
        choices = body.n * len(body.prompts())  # each prompt of a batch has its own n choices
        run = lambda: completions.CompletionRun(state, body)  # noqa: E731
        return await _generate(state, request, run, choices, body.stream, completions)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        if "anthropic-version" in request.headers:  # the anthropic SDK's models.list()
            return models_page(state)
        card = {
            "id": config.served_model_name, "object": "model", "created": state.created, "owned_by": "kvreuse",
            "max_model_len": state.engine.max_model_len,
        }  # fmt: skip
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> Response:
        if aengine.error is not None:
            return JSONResponse({"status": "error", "error": str(aengine.error)}, status_code=503)
        return JSONResponse({"status": "draining" if state.draining else "ok", "in_flight": state.in_flight})

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        await state.refresh_stats()
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/cache/reset", openapi_extra={"requestBody": JSON_OBJECT_BODY})
    async def cache_reset(request: Request) -> dict[str, Any]:
        try:
            options = json.loads(await request.body())
        except ValueError:
            options = None
        if not isinstance(options, dict):
            raise bad_request("the body must be a JSON object (send {})")
        if state.tenants.enabled:  # one tenant must not drop every tenant's cache
            raise APIError(403, "resetting the shared prefix cache is disabled when API keys are set",
                           type="permission_error", code="forbidden")  # fmt: skip
        try:
            await state.on_engine(lambda e: e.reset_prefix_cache())
        except EngineError as e:
            raise APIError(409, str(e), code="engine_busy") from None
        state.clear_diagnostics()
        return {"status": "ok"}

    @app.get("/debug/kv")
    async def debug_kv() -> dict[str, Any]:
        def snapshot(e):
            try:
                return {"ok": True, "pages": e.check_integrity()._asdict(), "stats": e.stats()._asdict()}
            except AssertionError as err:
                return {"ok": False, "error": str(err), "stats": e.stats()._asdict()}

        return {**await state.on_engine(snapshot), "in_flight": state.in_flight}

    install_cache_routes(app, state)
    install_anthropic_routes(app, state, _generate)
    app.add_middleware(
        RequestGuard,
        allowed_hosts=config.allowed_hosts,
        max_request_bytes=config.max_request_bytes,
        json_paths={r.path for r in app.routes if "POST" in getattr(r, "methods", ())},
        authenticate=state.tenants.authenticate,
        on_error=error_response,
        count=lambda path, status: state.metrics.http_requests.labels(path, str(status)).inc(),
    )
    if config.cors_origins:  # closed unless asked: no CORS headers, so no page can read responses
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=[
                "Content-Type",
                "Authorization",
                "x-api-key",
                "anthropic-version",
                "anthropic-beta",
            ],
        )
    document_errors(app, (ChatCompletionRequest, CompletionRequest))
    return app
