"""What a chat and a completion request in flight share: ids, per-choice params, the n engine streams."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from runtime.cache_scope import PUBLIC
from runtime.request import RequestOutput
from runtime.server.params import sampling_params
from runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from runtime.server.state import ServerState
from runtime.server.streaming import merge_streams


class EngineRun:
    """One request's n choices on the engine; validated (a 400 via EngineError) before any response starts."""

    def __init__(
        self,
        state: ServerState,
        req: ChatCompletionRequest | CompletionRequest,
        id_prefix: str,
        prompt_ids: list[int],
    ) -> None:
        self.state, self.req = state, req
        self.id = f"{id_prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = state.config.served_model_name
        self.params = [sampling_params(req, state.engine, len(prompt_ids), i) for i in range(req.n)]
        self.prompt_ids = state.engine.validate(prompt_ids, self.params[0])
        self.scope = PUBLIC  # the app sets the tenant's scope (runtime/server/tenants.py)

    def head(self, obj: str) -> dict[str, Any]:
        """The fields every response object and chunk of this request starts with."""
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def streams(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        return merge_streams(
            [
                self.state.aengine.stream(self.prompt_ids, p, f"{self.id}-{i}", self.scope)
                for i, p in enumerate(self.params)
            ]
        )

    def observe(self, outs: list[RequestOutput]) -> None:
        for o in outs:
            self.state.metrics.observe_request(
                o.prompt_tokens, o.cached_tokens, len(o.output_token_ids), o.ttft_s, o.decode_s
            )
