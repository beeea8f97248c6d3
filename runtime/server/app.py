"""The FastAPI application: routes, admission around each generation, client-disconnect handling."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from runtime.async_engine import AsyncEngine
from runtime.engine import EngineError
from runtime.server import chat, completions
from runtime.server.anthropic import errors as anthropic_errors
from runtime.server.anthropic.routes import install_anthropic_routes, models_page
from runtime.server.cache_routes import install_cache_routes
from runtime.server.errors import APIError, error_response, install_error_handlers
from runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from runtime.server.state import ServerConfig, ServerState
from runtime.server.streaming import Once

DISCONNECT_POLL_S = 0.25


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


async def _generate(
    state: ServerState, request: Request, run: Any, n: int, stream: bool, module: Any
) -> Response:
    tenant = request.state.tenant
    session = getattr(run.req, "user", None) or request.headers.get("x-session-id")
    run.scope = state.tenants.scope(tenant, session, state.tenants.public_len(getattr(run, "prompt", None)))
    state.tenants.admit(tenant, n)
    try:
        state.admit(n)
    except APIError:
        state.tenants.release(tenant, n)
        raise

    def _release() -> None:
        state.release(n)
        state.tenants.release(tenant, n)

    release = Once(_release)
    if stream:
        return module.stream_response(run, release)
    try:
        body = await _unless_disconnected(request, module.complete(run))
    finally:
        release()
    return JSONResponse(body) if body is not None else Response(status_code=499)


def create_app(
    aengine: AsyncEngine, config: ServerConfig, on_shutdown: Callable[[], None] | None = None
) -> FastAPI:
    """An app serving ``aengine``; ``on_shutdown`` runs after the last request (e.g. stop the engine)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        if on_shutdown is not None:
            on_shutdown()

    app = FastAPI(title="kvreuse", version="0.1.0", lifespan=lifespan)
    state = ServerState(aengine, config)
    app.state.kv = state
    install_error_handlers(app)

    @app.middleware("http")
    async def _authenticate(request: Request, call_next):
        try:
            request.state.tenant = state.tenants.authenticate(request.url.path, request.headers)
        except APIError as e:
            if anthropic_errors.is_anthropic(request.url.path, request.headers):
                return anthropic_errors.error_response(e)
            return error_response(e)
        return await call_next(request)

    @app.middleware("http")
    async def _count(request: Request, call_next):
        response = await call_next(request)
        if request.url.path.startswith("/v1/"):
            state.metrics.http_requests.labels(request.url.path, str(response.status_code)).inc()
        return response

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        state.check_model(body.model)
        run = chat.ChatRun(state, body)
        return await _generate(state, request, run, body.n, body.stream, chat)

    @app.post("/v1/completions")
    async def text_completions(body: CompletionRequest, request: Request) -> Response:
        state.check_model(body.model)
        run = completions.CompletionRun(state, body)
        return await _generate(state, request, run, body.n, body.stream, completions)

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

    @app.get("/metrics")
    async def metrics() -> Response:
        await state.refresh_stats()
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/cache/reset")
    async def cache_reset() -> dict[str, Any]:
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
    return app
