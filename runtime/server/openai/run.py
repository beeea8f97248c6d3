"""What an OpenAI chat and completion run share over the core run: response heads, sampling from the
body (with ``logit_bias``), usage and its streaming rule."""

from __future__ import annotations

import dataclasses
from typing import Any

from kvreuse.runtime.engine.outputs import RequestOutput
from kvreuse.runtime.server.core.run import MakeParams
from kvreuse.runtime.server.openai.logit_bias import logit_bias_ids
from kvreuse.runtime.server.openai.params import sampling_params
from kvreuse.runtime.server.openai.protocol import ChatCompletionRequest, CompletionRequest
from kvreuse.runtime.server.openai.usage import StreamUsage, usage
from kvreuse.runtime.server.state import ServerState


def body_params(state: ServerState, req: ChatCompletionRequest | CompletionRequest) -> MakeParams:
    """Per-choice sampling params from an OpenAI body (``logit_bias`` resolved once)."""
    bias = logit_bias_ids(req.logit_bias)

    def make(prompt_len: int, choice: int):
        return dataclasses.replace(sampling_params(req, state.engine, prompt_len, choice), logit_bias=bias)

    return make


class OpenAIRun:
    """Mixin over ``core.run.EngineRun``: the fields every OpenAI response object and chunk carries."""

    req: ChatCompletionRequest | CompletionRequest

    def setup(self) -> None:
        self.stream_usage = StreamUsage(self.req.stream_options)

    def head(self, obj: str) -> dict[str, Any]:
        """The fields every response object and chunk of this request starts with."""
        return {
            "id": self.id, "object": obj, "created": self.created, "model": self.model,  # type: ignore[attr-defined]
            "system_fingerprint": self.fingerprint,  # type: ignore[attr-defined]
        }  # fmt: skip

    def usage(self, ordered: list[RequestOutput]) -> dict[str, Any]:
        totals = usage([len(p) for p in self.prompts], ordered, self.req.n)  # type: ignore[attr-defined]
        return {**totals, **self.clamp_usage()}  # type: ignore[attr-defined]
