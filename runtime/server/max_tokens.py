"""What a request's ``max_tokens`` becomes when the prompt leaves less room than it asks for.

Agents ask for a fixed output budget whatever the context holds (Claude Code always sends
``max_tokens: 32000``), so by default the server clamps it to the room left, as llama.cpp does:
``ClampMaxTokens``. ``--max-tokens-overflow refuse`` keeps the strict answer (a 400 from admission,
``context_length_exceeded``): ``RefuseOverflow`` leaves the params as they are.  A clamp is reported
(``Clamp``) in the response's usage (``max_tokens_clamped``) and its ``kvreuse`` extension.

Invariant: a clamped request's prompt + max_tokens == the engine's token capacity, and max_tokens >= 1
(a prompt that leaves no room is refused by admission either way).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Protocol

from kvreuse.runtime.sampling.params import SamplingParams


class Clamp(NamedTuple):
    """One clamp: what the client asked for and what it got."""

    asked: int
    granted: int

    def report(self) -> dict[str, Any]:
        return {"asked": self.asked, "granted": self.granted}


class MaxTokensPolicy(Protocol):
    """How ``max_tokens`` is fitted to the room a prompt leaves."""

    name: str

    def fit(
        self, params: SamplingParams, prompt_len: int, capacity: int
    ) -> tuple[SamplingParams, Clamp | None]: ...


class ClampMaxTokens:
    """``max_tokens`` beyond the room left becomes the room left (llama.cpp's behaviour)."""

    name = "clamp"

    def fit(
        self, params: SamplingParams, prompt_len: int, capacity: int
    ) -> tuple[SamplingParams, Clamp | None]:
        room = capacity - prompt_len
        if room < 1 or params.max_tokens <= room:
            return params, None  # fits, or cannot fit at all (admission says why)
        granted = max(room, len(params.forced_tokens))
        clamp = Clamp(params.max_tokens, granted)
        assert prompt_len + granted == capacity or granted == len(params.forced_tokens)
        return dataclasses.replace(params, max_tokens=granted), clamp


class RefuseOverflow:
    """``max_tokens`` as asked: a prompt + max_tokens over the capacity is admission's 400."""

    name = "refuse"

    def fit(
        self, params: SamplingParams, prompt_len: int, capacity: int
    ) -> tuple[SamplingParams, Clamp | None]:
        return params, None


POLICIES: dict[str, type] = {"clamp": ClampMaxTokens, "refuse": RefuseOverflow}


def policy(name: str) -> MaxTokensPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"--max-tokens-overflow must be one of {', '.join(POLICIES)}") from None
