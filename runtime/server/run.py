"""What a chat and a completion request in flight share: ids, per-choice params, the engine streams."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from runtime.cache_scope import PUBLIC
from runtime.constrained import Grammar
from runtime.request import RequestOutput
from runtime.server.fingerprint import system_fingerprint
from runtime.server.params import sampling_params
from runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from runtime.server.state import ServerState
from runtime.server.streaming import merge_streams
from runtime.server.unsupported import logit_bias_ids
from runtime.server.usage import StreamUsage, usage


class EngineRun:
    """One request's prompts x n choices on the engine; validated (a 400 via EngineError) before any
    response starts.  Choice ``index`` runs prompt by prompt: prompt ``p``'s choices are ``p*n .. p*n+n-1``.
    """

    def __init__(
        self,
        state: ServerState,
        req: ChatCompletionRequest | CompletionRequest,
        id_prefix: str,
        prompts: list[list[int]],
        grammar: Grammar | None = None,
    ) -> None:
        self.state, self.req = state, req
        self.id = f"{id_prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = state.config.served_model_name
        self.fingerprint = system_fingerprint(state.engine)
        bias = logit_bias_ids(req.logit_bias)
        self.prompts: list[list[int]] = []
        self.params = []  # per choice index
        for ids in prompts:
            ps = [
                dataclasses.replace(
                    sampling_params(req, state.engine, len(ids), i), logit_bias=bias, grammar=grammar
                )
                for i in range(req.n)
            ]
            self.prompts.append(state.engine.validate(ids, ps[0]))
            self.params += ps
        self.prompt_ids = self.prompts[0]
        self.stream_usage = StreamUsage(req.stream_options)
        self.scope = PUBLIC  # the app sets the tenant's scope (runtime/server/tenants.py)

    @property
    def num_choices(self) -> int:
        return len(self.params)

    def head(self, obj: str) -> dict[str, Any]:
        """The fields every response object and chunk of this request starts with."""
        return {
            "id": self.id, "object": obj, "created": self.created, "model": self.model,
            "system_fingerprint": self.fingerprint,
        }  # fmt: skip

    def prompt_of(self, index: int) -> list[int]:
        return self.prompts[index // self.req.n]

    def usage(self, ordered: list[RequestOutput]) -> dict[str, Any]:
        return usage([len(p) for p in self.prompts], ordered, self.req.n)

    def streams(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        return merge_streams(
            [
                self.state.aengine.stream(self.prompt_of(i), p, f"{self.id}-{i}", self.scope)
                for i, p in enumerate(self.params)
            ]
        )

    def observe(self, outs: list[RequestOutput]) -> None:
        for o in outs:
            self.state.metrics.observe_request(
                o.prompt_tokens, o.cached_tokens, len(o.output_token_ids), o.ttft_s, o.decode_s
            )
