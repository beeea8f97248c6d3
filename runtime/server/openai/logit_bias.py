"""``logit_bias`` (supported): the body's checks and its conversion to the engine's token-id map."""

from __future__ import annotations

import math
from typing import Any

MAX_BIAS = 100.0


def check_logit_bias(bias: dict[str, Any] | None) -> dict[str, Any] | None:
    """Keys are token ids written as integers, values numbers in [-100, 100] (OpenAI's range).

    Token ids beyond the vocabulary are the engine's check (it knows the vocabulary).
    """
    if bias is None:
        return None
    for key, value in bias.items():
        try:
            tid = int(key)
        except ValueError:
            raise ValueError(f"logit_bias key {key!r} is not an integer token id") from None
        if tid < 0:
            raise ValueError(f"logit_bias key {key!r} is not a token id")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"logit_bias[{key!r}] must be a number, got {value!r}")
        if not -MAX_BIAS <= value <= MAX_BIAS:
            raise ValueError(f"logit_bias[{key!r}] must be in [-100, 100], got {value}")
    return bias


def logit_bias_ids(bias: dict[str, Any] | None) -> dict[int, float] | None:
    """The checked bias as the engine takes it (token id -> bias)."""
    return {int(k): float(v) for k, v in bias.items()} if bias else None
