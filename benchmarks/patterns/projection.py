"""How long a benchmark run will take: expected prefill per request, and a cost model fitted on the fly.

The expected prefill of a request is what a paged prefix cache would compute for it (its prompt minus
the longest whole-page prefix shared with any earlier prompt of the same pattern; everything when the
cache is off). Fitted on the first pattern's measured requests, ``seconds = a * prefilled + b`` turns
the expected tokens of every remaining request into a projected total.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvreuse.benchmarks.patterns.ideal import best_prefix


def expected_prefill(prompts: Sequence[Sequence[int]], cache: bool, page: int) -> list[int]:
    """Tokens a paged prefix cache would prefill for each prompt (outputs ignored: they are unknown yet)."""
    if not cache:
        return [len(p) for p in prompts]
    return [max(1, len(p) - best_prefix(p, prompts[:k]) // page * page) for k, p in enumerate(prompts)]


class CostModel:
    """``seconds per request = a * prefilled tokens + b``, least squares over the requests measured so far."""

    def __init__(self) -> None:
        self.tokens: list[float] = []
        self.seconds: list[float] = []

    def add(self, prefilled: int, seconds: float) -> None:
        self.tokens.append(float(prefilled))
        self.seconds.append(seconds)

    def coefficients(self) -> tuple[float, float]:
        x, y = np.asarray(self.tokens), np.asarray(self.seconds)
        if len(x) < 2 or np.ptp(x) == 0:
            return float(y.sum() / max(1.0, x.sum())), 0.0
        a, b = np.linalg.lstsq(np.stack([x, np.ones_like(x)], axis=1), y, rcond=None)[0]
        if b < 0:  # noisy fit: put all the time on tokens rather than predict negative overheads
            return float(y.sum() / x.sum()), 0.0
        return max(float(a), 0.0), float(b)

    def seconds_for(self, expected: Sequence[int]) -> float:
        a, b = self.coefficients()
        return a * float(sum(expected)) + b * len(expected)
