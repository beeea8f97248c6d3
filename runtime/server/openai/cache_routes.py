"""``GET /v1/cache`` (introspection), ``POST /v1/cache/prewarm`` and the cache's Prometheus series.

Introspection shows page counts of the whole pool, and of the pins only the caller's own
(sessions and prewarmed prefixes, by id, with pinned token counts and TTL left): never token
content, never another tenant's sessions.  Prewarm renders a chat body (messages + tools), runs
it for one token and pins the result under ``("prewarm", digest)`` for the session TTL, so a
parent can compute the shared part of its sub-agents' prompts once; it answers how many prompt
tokens are now cached.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

from fastapi import FastAPI, Request

from kvreuse.runtime.request import CacheScope
from kvreuse.runtime.server.cache_info import cache_snapshot, describe
from kvreuse.runtime.server.core.generate import admit_run, parse_body
from kvreuse.runtime.server.core.streaming import final_outputs
from kvreuse.runtime.server.openai import chat
from kvreuse.runtime.server.openai.protocol import ChatCompletionRequest
from kvreuse.runtime.server.state import ServerState


class PrewarmCaller(NamedTuple):
    """A prewarm's scope: the tenant's namespace, pinned under an owner named by the prompt's digest
    (the same body prewarmed twice is one pin)."""

    tenant: str | None

    def scope(self, session: str | None, prompt: Any = None) -> CacheScope:
        digest = hashlib.sha256(repr((self.tenant, prompt.token_ids)).encode()).hexdigest()[:16]
        return CacheScope(self.tenant, 0, (self.tenant, "prewarm", digest))


def install_cache_routes(app: FastAPI, state: ServerState) -> None:
    ref = {"$ref": f"#/components/schemas/{ChatCompletionRequest.__name__}"}
    prewarm_body = {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}

    @app.get("/v1/cache")
    async def cache_info(request: Request) -> dict[str, Any]:
        tenant = request.state.tenant
        return describe(await state.on_engine(cache_snapshot), tenant, not state.tenants.sees_all(tenant))

    @app.post("/v1/cache/prewarm", openapi_extra=prewarm_body)
    async def prewarm(request: Request) -> dict[str, Any]:
        # parsed, rendered and tokenised off the event loop, in the caller's prep share
        body = await parse_body(state, request, ChatCompletionRequest, lambda o: state.check_messages(
            o.get("messages") if isinstance(o, dict) else None))  # fmt: skip
        state.check_model(body.model)
        one = {"max_tokens": 1, "max_completion_tokens": None, "n": 1, "stream": False, "temperature": 0}
        prompt = body.model_copy(update=one)
        run, release = await admit_run(  # the generation routes' admission path
            state, PrewarmCaller(request.state.tenant), 1, lambda c: chat.ChatCompletionRun(state, c, prompt)
        )
        digest = run.scope.session[2]
        try:
            out = (await final_outputs(run.streams()))[0]
        finally:
            release()
        pinned = await state.on_engine(lambda e: e.cache.is_pinned(run.scope.session))
        ps = state.engine.cache.page_size
        return {
            "object": "cache.prewarm", "id": digest, "prompt_tokens": len(run.prompt_ids),
            "cached_tokens": len(run.prompt_ids) // ps * ps if pinned else 0, "pinned": pinned,
            "already_cached_tokens": out.cached_tokens, "ttl_s": state.engine.config.session_ttl,
        }  # fmt: skip
