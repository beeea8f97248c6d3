"""One request in flight on the engine, whatever the protocol: prompts x n choices, their params, the streams."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from kvreuse.runtime.engine.outputs import RequestOutput
from kvreuse.runtime.request import CacheScope
from kvreuse.runtime.sampling.constrained import Grammar
from kvreuse.runtime.sampling.params import SamplingParams
from kvreuse.runtime.server.core.prompting import ChatPrompt
from kvreuse.runtime.server.core.streaming import merge_streams
from kvreuse.runtime.server.fingerprint import system_fingerprint
from kvreuse.runtime.server.max_tokens import Clamp
from kvreuse.runtime.server.state import ServerState

# (prompt length, choice index) -> that choice's sampling params (the protocol reads its own body)
MakeParams = Callable[[int, int], SamplingParams]


class Caller(Protocol):
    """Whose request this is (``runtime/server/tenants.py``'s ``Caller``, or the prewarm route's)."""

    def scope(self, session: str | None, prompt: ChatPrompt | None = None) -> CacheScope: ...


class EngineRun:
    """One request's prompts x n choices on the engine, built complete once (in the prep thread): its
    cache scope, then one engine ``Request`` per choice, each validated once (a 400 via EngineError)
    before any response starts.  Choice ``index`` runs prompt by prompt: prompt ``p``'s choices are
    ``p*n .. p*n+n-1``.  ``session`` names the conversation for the tenant's cache scope (OpenAI
    ``user``, Anthropic ``metadata.user_id``; else the caller's ``X-Session-Id``).  ``prompt``: a chat
    run's rendered prompt, on which the public part of the scope depends (None for bare token ids).
    """

    def __init__(
        self,
        state: ServerState,
        caller: Caller,
        id_prefix: str,
        prompts: list[list[int]],
        n: int,
        make_params: MakeParams,
        grammar: Grammar | None = None,
        session: str | None = None,
        prompt: ChatPrompt | None = None,
    ) -> None:
        self.state, self.n, self.session = state, n, session
        self.id = f"{id_prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = state.config.served_model_name
        self.fingerprint = system_fingerprint(state.engine)
        self.scope: CacheScope = caller.scope(session, prompt)
        self.params: list[SamplingParams] = []  # per choice index
        self.requests = []  # per choice index: built and validated here, streamed by ``streams``
        self.clamp: Clamp | None = None  # max_tokens cut to the room the prompt left (the first that was)
        for p, ids in enumerate(prompts):
            for c in range(n):
                ps = dataclasses.replace(make_params(len(ids), c), grammar=grammar)
                ps, clamp = state.max_tokens.fit(ps, len(ids), state.engine.admission.token_capacity)
                self.clamp = self.clamp or clamp
                rid = f"{self.id}-{p * n + c}"
                self.requests.append(state.engine.make_request(ids, self.first_params(ps), rid, self.scope))
                self.params.append(ps)
        self.prompts: list[list[int]] = [r.prompt_ids for r in self.requests[::n]]
        self.prompt_ids = self.prompts[0]
        self.details: dict[str, Any] = {}  # what the live page shows beyond the figures (chat: the break)

    def first_params(self, params: SamplingParams) -> SamplingParams:
        """What a choice's engine request runs with (a reasoning budget's first phase caps it)."""
        return params

    @property
    def num_choices(self) -> int:
        return len(self.params)

    def prompt_of(self, index: int) -> list[int]:
        return self.prompts[index // self.n]

    def streams(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        return merge_streams([self.state.aengine.stream(r) for r in self.requests])

    def clamp_usage(self) -> dict[str, Any]:
        """The usage fields that report a clamp of ``max_tokens`` (none when there was none)."""
        return {} if self.clamp is None else {"max_tokens_clamped": self.clamp.report()}

    def observe(self, outs: list[RequestOutput]) -> None:
        for o in outs:
            self.state.metrics.observe_request(
                o.prompt_tokens, o.cached_tokens, len(o.output_token_ids), o.ttft_s, o.decode_s
            )
        self.state.activity.record(self, outs, time.time())
