"""Page-weighted return statistics of one class of radix nodes, for the ``hazard`` eviction policies."""

from __future__ import annotations

GAP_BUCKETS = 48  # log2 buckets of a return gap, in ticks


class ReturnStats:
    """One class of nodes: page-weighted waits and returns, and a log2 histogram of the gaps."""

    def __init__(self) -> None:
        self.entries = self.returns = 0.0
        self.count = [0.0] * GAP_BUCKETS
        self._above: list[float] | None = None  # suffix sums of ``count``, rebuilt after a return

    def back(self, gap: int, pages: int) -> None:
        self.returns += pages
        self.count[min(max(gap, 1).bit_length() - 1, GAP_BUCKETS - 1)] += pages
        self._above = None

    def survival(self, x: float) -> float:
        """Share of the returns whose gap was longer than ``x`` (uniform within a bucket)."""
        if self._above is None:
            self._above = [0.0] * (GAP_BUCKETS + 1)
            for b in range(GAP_BUCKETS - 1, -1, -1):
                self._above[b] = self._above[b + 1] + self.count[b]
        b = min(max(int(x), 1).bit_length() - 1, GAP_BUCKETS - 1)
        inside = min(1.0, max(0.0, ((2 << b) - x) / (1 << b)))
        return (self._above[b + 1] + inside * self.count[b]) / self.returns

    def soon(self, idle: int, window: float) -> float:
        """Chance that a node idle for ``idle`` ticks is back within ``window`` more (Bayes over the
        share that ever comes back: the longer a node waits, the likelier it is one that never will)."""
        if self.returns == 0:
            return 0.0
        p = self.returns / max(self.entries, self.returns)
        now_s, later_s = self.survival(idle), self.survival(idle + window)
        waiting = p * now_s + (1 - p)
        return p * (now_s - later_s) / waiting if waiting > 0 else 0.0
