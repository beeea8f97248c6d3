"""One request's position in its grammar: fills the next-token mask, advances on each committed token."""

from __future__ import annotations

from typing import Any

import torch


class Matcher:
    """Wraps an llguidance ``LLMatcher``; owned by one request and advanced only with its committed tokens.

    It is the only per-request state of constrained decoding, so whichever object carries a request's
    sampling inputs can carry it.
    """

    def __init__(self, matcher: Any, eos_ids: frozenset[int]) -> None:
        self._m = matcher
        self._eos = sorted(eos_ids)

    def fill(self, row: torch.Tensor) -> None:
        """Write the allowed-token bitmask (int32, 32 tokens per word) into ``row``, a contiguous CPU view."""
        if self._m.is_error():
            # cannot happen with tokens the mask allowed; end the request rather than generate garbage
            row.zero_()
            for t in self._eos:
                row[t // 32] |= _bit(t % 32)
            return
        self._m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())

    def advance(self, token: int) -> bool:
        """Consume a committed token; False when the grammar rejects it (the matcher is then in error)."""
        if token in self._eos and (self._m.is_accepting() or self._m.is_stopped()):
            return True
        return bool(self._m.consume_token(token))

    @property
    def finished(self) -> bool:
        return bool(self._m.is_stopped())

    @property
    def error(self) -> str | None:
        return self._m.get_error() if self._m.is_error() else None


def _bit(i: int) -> int:
    return (1 << i) - (1 << 32) if i == 31 else 1 << i  # int32 two's complement for the top bit
