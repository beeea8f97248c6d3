"""What a request's ``max_tokens`` becomes when the prompt leaves less room than it asks for.

Agents ask for a fixed output budget whatever the context holds (Claude Code always sends
``max_tokens: 32000``), so by default the server clamps it to the room left, as llama.cpp does:
``ClampMaxTokens``. ``--max-tokens-overflow refuse`` keeps the strict answer (a 400 from admission,
``context_length_exceeded``): ``RefuseOverflow`` leaves the params as they are.  A clamp is reported
(``Clamp``) in the response's usage (``max_tokens_clamped``) and its ``kvreuse`` extension.

Invariant: a clamped request's prompt + max_tokens == the engine's token capacity, and max_tokens >= 1
(a prompt that leaves no room is refused by admission either way).

``--max-tokens-cap N`` (llama.cpp's server ``--n-predict``: a request asking more gets N) bounds every
request's output on top of either policy (``CappedMaxTokens``): a benchmark of a small model that
rarely stops finishes in bounded time.  A cap is reported like a clamp, ``by`` saying which bound cut
it ("room" or "cap").  Invariant: a capped request's max_tokens <= N (forced tokens aside: a scripted
reply is never cut).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Protocol

from kvreuse.runtime.sampling.params import SamplingParams


class Clamp(NamedTuple):
    """One clamp: what the client asked for and what it got."""

    asked: int
    granted: int
    by: str = "room"  # "room": the context the prompt left; "cap": the server's --max-tokens-cap

    def report(self) -> dict[str, Any]:
        return {
            "asked": self.asked,
            "granted": self.granted,
            **({"by": self.by} if self.by != "room" else {}),
        }


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


class CappedMaxTokens:
    """``max_tokens`` over the server's cap becomes the cap, then ``inner`` fits it to the room left."""

    def __init__(self, inner: MaxTokensPolicy, cap: int) -> None:
        if cap < 1:
            raise ValueError("--max-tokens-cap must be at least 1")
        self.inner, self.cap = inner, cap
        self.name = f"{inner.name}, cap {cap}"

    def fit(
        self, params: SamplingParams, prompt_len: int, capacity: int
    ) -> tuple[SamplingParams, Clamp | None]:
        asked = params.max_tokens
        cap = max(self.cap, len(params.forced_tokens))
        if asked > cap:
            params = dataclasses.replace(params, max_tokens=cap)
        params, clamp = self.inner.fit(params, prompt_len, capacity)
        if clamp is not None:
            return params, Clamp(asked, clamp.granted, "room")
        if asked > cap:
            assert params.max_tokens == cap
            return params, Clamp(asked, cap, "cap")
        return params, None


POLICIES: dict[str, type] = {"clamp": ClampMaxTokens, "refuse": RefuseOverflow}


def policy(name: str, cap: int | None = None) -> MaxTokensPolicy:
    try:
        inner = POLICIES[name]()
    except KeyError:
        raise ValueError(f"--max-tokens-overflow must be one of {', '.join(POLICIES)}") from None
    return inner if cap is None else CappedMaxTokens(inner, cap)
