"""One request in flight on the engine, whatever the protocol: prompts x n choices, their params, the streams."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable

from runtime.cache.scope import PUBLIC
from runtime.request import RequestOutput
from runtime.sampling.constrained import Grammar
from runtime.sampling.params import SamplingParams
from runtime.server.core.streaming import merge_streams
from runtime.server.fingerprint import system_fingerprint
from runtime.server.state import ServerState

# (prompt length, choice index) -> that choice's sampling params (the protocol reads its own body)
MakeParams = Callable[[int, int], SamplingParams]


class EngineRun:
    """One request's prompts x n choices on the engine; validated (a 400 via EngineError) before any
    response starts.  Choice ``index`` runs prompt by prompt: prompt ``p``'s choices are ``p*n .. p*n+n-1``.
    ``session`` names the conversation for the tenant's cache scope (OpenAI ``user``, Anthropic
    ``metadata.user_id``).
    """

    def __init__(
        self,
        state: ServerState,
        id_prefix: str,
        prompts: list[list[int]],
        n: int,
        make_params: MakeParams,
        grammar: Grammar | None = None,
        session: str | None = None,
    ) -> None:
        self.state, self.n, self.session = state, n, session
        self.id = f"{id_prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = state.config.served_model_name
        self.fingerprint = system_fingerprint(state.engine)
        self.prompts: list[list[int]] = []
        self.params: list[SamplingParams] = []  # per choice index
        for ids in prompts:
            ps = [dataclasses.replace(make_params(len(ids), i), grammar=grammar) for i in range(n)]
            self.prompts.append(state.engine.validate(ids, ps[0]))
            self.params += ps
        self.prompt_ids = self.prompts[0]
        self.scope = PUBLIC  # the app sets the tenant's scope (runtime/server/tenants.py)

    @property
    def num_choices(self) -> int:
        return len(self.params)

    def prompt_of(self, index: int) -> list[int]:
        return self.prompts[index // self.n]

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
