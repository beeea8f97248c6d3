"""One request's position in its grammar: fills the next-token mask, advances on each committed token."""

from __future__ import annotations

from typing import Any

import torch

WRAP_UP_TOKENS = 24  # the last this many tokens of max_tokens prefer tokens that close the JSON


class Matcher:
    """Wraps an llguidance ``LLMatcher``; owned by one request and advanced only with its committed tokens.

    It is the only per-request state of constrained decoding, so whichever object carries a request's
    sampling inputs can carry it.  A small model can loop inside a free string until ``max_tokens``
    cuts the JSON off; so in the last ``WRAP_UP_TOKENS`` of its budget the mask keeps, when the grammar
    allows any, only the tokens of the first tier of ``closers`` that it allows: tokens that end a
    string (``"`` then only ``}``/``]``), then tokens made of ``}``/``]`` (each tier with EOS), and the
    output still ends valid.  Inside a string ``}`` is text, so ending the string comes first.
    """

    def __init__(
        self,
        matcher: Any,
        eos_ids: frozenset[int],
        budget: int | None = None,
        closers: list[torch.Tensor] | None = None,
    ) -> None:
        self._m = matcher
        self._eos = sorted(eos_ids)
        self._left = budget
        self._closers = closers

    def fill(self, row: torch.Tensor) -> None:
        """Write the allowed-token bitmask (int32, 32 tokens per word) into ``row``, a contiguous CPU view."""
        if self._m.is_error():
            # cannot happen with tokens the mask allowed; end the request rather than generate garbage
            row.zero_()
            for t in self._eos:
                row[t // 32] |= _bit(t % 32)
            return
        self._m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
        if self._closers is not None and self._left is not None and self._left <= WRAP_UP_TOKENS:
            for tier in self._closers:
                closing = row & tier
                if bool(closing.any()):
                    row.copy_(closing)
                    break

    def advance(self, token: int) -> bool:
        """Consume a committed token; False when the grammar rejects it (the matcher is then in error)."""
        if self._left is not None:
            self._left -= 1
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
