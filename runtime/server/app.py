"""The FastAPI application: routes, admission around each generation, client-disconnect handling."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import EngineError
from kvreuse.runtime.server.anthropic import errors as anthropic_errors
from kvreuse.runtime.server.anthropic import routes as anthropic_routes
from kvreuse.runtime.server.body import load_json
from kvreuse.runtime.server.core.generate import generate, parse_body
from kvreuse.runtime.server.errors import APIError, bad_request, install_error_handlers
from kvreuse.runtime.server.guard import RequestGuard
from kvreuse.runtime.server.loads import worker_load
from kvreuse.runtime.server.openai import chat, completions
from kvreuse.runtime.server.openai import errors as openai_errors
from kvreuse.runtime.server.openai import models as openai_models
from kvreuse.runtime.server.openai.cache_routes import install_cache_routes
from kvreuse.runtime.server.openai.errors import document_errors
from kvreuse.runtime.server.openai.protocol import ChatCompletionRequest, CompletionRequest
from kvreuse.runtime.server.openai.responses_protocol import ResponsesRequest
from kvreuse.runtime.server.openai.responses_routes import install_responses_routes
from kvreuse.runtime.server.recorder import RequestRecorder
from kvreuse.runtime.server.state import ServerConfig, ServerState
from kvreuse.runtime.server.ui.routes import install_ui, page_open

# bodiless POSTs still say application/json (see guard.py); the body itself is ignored
JSON_OBJECT_BODY = {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI for a body we parse ourselves (``parse_body``); ``document_errors`` adds the schema."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def render_error(path: str, headers: Mapping[str, str], e: APIError) -> Response:
    """Each caller gets errors in its protocol's shape: Anthropic's on the Anthropic routes, OpenAI's elsewhere."""
    return (
        anthropic_errors if anthropic_errors.is_anthropic(path, headers) else openai_errors
    ).error_response(e)


def create_app(
    aengine: AsyncEngine,
    config: ServerConfig,
    on_shutdown: Callable[[], None] | None = None,
    services: Sequence[Callable[[ServerState], AbstractAsyncContextManager]] = (),
) -> FastAPI:
    """An app serving ``aengine``; ``on_shutdown`` runs after the last request (e.g. stop the engine);
    each of ``services`` (e.g. the gRPC worker) runs on the app's event loop while the app does."""
    state = ServerState(aengine, config)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        async with AsyncExitStack() as stack:
            for service in services:
                await stack.enter_async_context(service(state))
            yield
            await state.background.cancel()  # a re-render in flight aborts its request now
        state.prep.shutdown()
        if on_shutdown is not None:
            on_shutdown()

    app = FastAPI(title="kvreuse", version="0.1.0", lifespan=lifespan)
    app.state.kv = state
    install_error_handlers(app, render_error)

    def count_messages(obj: Any) -> None:
        if isinstance(obj, dict):
            state.check_messages(obj.get("messages"))

    @app.post("/v1/chat/completions", openapi_extra=json_body(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        body = await parse_body(state, request, ChatCompletionRequest, count_messages)
        state.check_model(body.model)
        return await generate(
            state,
            request,
            lambda caller: chat.ChatCompletionRun(state, caller, body),
            body.n,
            body.stream,
            chat,
        )

    @app.post("/v1/completions", openapi_extra=json_body(CompletionRequest))
    async def text_completions(request: Request) -> Response:
        body = await parse_body(state, request, CompletionRequest)
        state.check_model(body.model)
        choices = body.n * len(body.prompts())  # each prompt of a batch has its own n choices
        run = lambda caller: completions.CompletionRun(state, caller, body)  # noqa: E731
        return await generate(state, request, run, choices, body.stream, completions)

    def anthropic_caller(request: Request) -> bool:  # the anthropic SDK always sends the header
        return "anthropic-version" in request.headers

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        return (
            anthropic_routes.models_page(state)
            if anthropic_caller(request)
            else openai_models.model_list(state)
        )

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> dict[str, Any]:
        # an unknown id is a 404, in the caller's shape (render_error)
        return (anthropic_routes if anthropic_caller(request) else openai_models).model_lookup(
            state, model_id
        )

    @app.get("/health")
    async def health() -> Response:
        return JSONResponse(*state.health())  # never waits for the engine or the prep pool

    @app.get("/v1/loads")
    async def loads() -> dict[str, Any]:
        return worker_load(state.engine)  # never waits for the engine: a router polls it

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        await state.refresh_stats()
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/cache/reset", openapi_extra={"requestBody": JSON_OBJECT_BODY})
    async def cache_reset(request: Request) -> dict[str, Any]:
        if not isinstance(load_json(await request.body()), dict):
            raise bad_request("the body must be a JSON object (send {})")
        return await reset_all_caches(request)

    # SGLang's name, which the SMG gateway's POST /flush_cache calls on every worker with its operator
    # key: a cache reset of the whole cluster through the gateway (docs/scaling.md); no body
    @app.post("/flush_cache", include_in_schema=False)
    async def flush_cache(request: Request) -> dict[str, Any]:
        return await reset_all_caches(request)

    async def reset_all_caches(request: Request) -> dict[str, Any]:
        if not state.tenants.sees_all(request.state.tenant):  # a tenant must not drop every tenant's cache
            raise APIError(403, "resetting the shared prefix cache needs an operator key (--operator-key)",
                           type="permission_error", code="forbidden")  # fmt: skip
        # a finished turn's re-rendered prefill still running would fill the cache again after the reset
        await state.background.settled()
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
                return {
                    "ok": True,
                    "pages": e.cache.check_integrity()._asdict(),
                    "stats": e.stats()._asdict(),
                }
            except AssertionError as err:
                return {"ok": False, "error": str(err), "stats": e.stats()._asdict()}

        return {**await state.on_engine(snapshot), "in_flight": state.in_flight}

    install_cache_routes(app, state)
    install_responses_routes(app, state, json_body(ResponsesRequest))
    anthropic_routes.install_anthropic_routes(app, state)
    authenticate = state.tenants.authenticate
    if config.ui:
        install_ui(app, state)
        authenticate = page_open(authenticate)
    app.add_middleware(
        RequestGuard,
        allowed_hosts=config.allowed_hosts,
        max_request_bytes=config.max_request_bytes,
        body_timeout_s=config.body_timeout_s,
        json_paths={r.path for r in app.routes if "POST" in getattr(r, "methods", ())}
        - {"/flush_cache"},  # no body
        authenticate=authenticate,
        on_error=render_error,
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
    if config.record is not None:  # outermost: it sees what the client sent and got, refusals included
        app.add_middleware(RequestRecorder, path=config.record)
    document_errors(
        app, (ChatCompletionRequest, CompletionRequest, ResponsesRequest, *anthropic_routes.BODIES)
    )
    return app
