"""Admission around one generation, body parsing off the event loop, client-disconnect handling.

``admit_run`` is the one admission path of every front (the HTTP routes, the prewarm route and the
gRPC worker): the
tenant's share and the server's capacity taken, the run built complete (its cache scope, each engine
request validated once) off the event loop, and a release that gives both back once.  ``generate``
is the HTTP answer around it, the same for every protocol; the protocol's module answers
(``complete`` for a whole response, ``stream_events`` for a stream, ``error_events`` for an error
after the headers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from kvreuse.runtime.server.body import load_json
from kvreuse.runtime.server.core.streaming import Once, guarded_events
from kvreuse.runtime.server.errors import APIError
from kvreuse.runtime.server.state import ServerState
from kvreuse.runtime.server.tenants import Caller

DISCONNECT_POLL_S = 0.25
M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")


class Tenanted(Protocol):
    """A caller as admission sees it: whose share it takes (``tenants.Caller``, or the prewarm route's)."""

    @property
    def tenant(self) -> str | None: ...


C = TypeVar("C", bound=Tenanted)


async def unless_disconnected(request: Request, work: Awaitable[dict[str, Any]]) -> dict[str, Any] | None:
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


async def parse_body(
    state: ServerState, request: Request, model: type[M], precheck: Callable[[Any], None] | None = None
) -> M:
    """The validated body, parsed and validated in the prep thread: a 16,000-message body costs the
    event loop nothing, and ``precheck`` refuses what cannot fit before pydantic walks all of it."""
    raw = await request.body()

    def parse() -> M:
        obj = load_json(raw)
        if precheck is not None:
            precheck(obj)
        try:
            return model.model_validate(obj)
        except ValidationError as e:
            raise RequestValidationError(e.errors()) from None

    return await state.prep.run(request.state.tenant, parse)


async def admit_run(state: ServerState, caller: C, n: int, make_run: Callable[[C], R]) -> tuple[R, Once]:
    """Admit ``n`` sequences for ``caller``'s tenant, then build ``make_run(caller)`` (the run, complete
    with its cache scope and validated engine requests) in the prep thread; returns it and the release
    the caller runs once the run is over.  Raises (APIError, EngineError) with nothing held."""
    tenant = caller.tenant
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
        # the tenant's last turn may still be prefilling as the client will resend it (core/rerender.py)
        await state.background.settled(tenant)
        # template rendering and tokenisation are CPU work: off the event loop, so /health and
        # every other request keep being answered while a big prompt is prepared
        run = await state.prep.run(tenant, make_run, caller)
    except BaseException:
        release()
        raise
    return run, release


async def generate(
    state: ServerState,
    request: Request,
    make_run: Callable[[Caller], Any],
    n: int,
    stream: bool,
    module: Any,
) -> Response:
    """Admit ``n`` sequences for the caller's tenant, build the run (complete, with its cache scope)
    off the event loop, answer."""
    caller = Caller(state.tenants, request.state.tenant, request.headers.get("x-session-id"))
    run, release = await admit_run(state, caller, n, make_run)
    if stream:
        return guarded_events(module.stream_events(run), run.id, release, module.error_events)
    try:
        body = await unless_disconnected(request, module.complete(run))
    finally:
        release()
    return JSONResponse(body) if body is not None else Response(status_code=499)
