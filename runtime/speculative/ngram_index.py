"""An incremental n-gram index over a growing token list: where did the last n tokens occur before?

Prompt lookup (the request's own prompt + output) and the per-tenant history both ask one question:
the latest earlier position where the sequence's last ``n`` tokens occurred, for the longest ``n``
that matched, so the tokens that followed there can be proposed as a draft.  The latest occurrence
wins: an agent rewriting a file or repeating a tool call copies the most recent copy of it.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_NS = (8, 5, 3, 2)  # longest first: a longer match predicts more of what follows


class NgramIndex:
    """``n``-gram (for each n in ``ns``) -> the latest position where it ended, over ``tokens``.

    ``update(tokens)`` indexes the n-grams that have at least one token after them (so a lookup never
    finds the query itself); ``tokens`` must only grow between calls (``reset`` otherwise).
    """

    def __init__(self, ns: Sequence[int] = DEFAULT_NS) -> None:
        self.ns = tuple(sorted(ns, reverse=True))
        self.tables: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.ns}
        self.indexed = 0  # n-grams ending before this position are in the tables

    def reset(self) -> None:
        for t in self.tables.values():
            t.clear()
        self.indexed = 0

    def update(self, tokens: Sequence[int]) -> None:
        end = len(tokens) - 1  # the last token has no continuation yet
        for e in range(self.indexed, end):
            for n, table in self.tables.items():
                if e + 1 >= n:
                    table[tuple(tokens[e + 1 - n : e + 1])] = e
        self.indexed = max(self.indexed, end)

    def lookup(self, query: Sequence[int]) -> tuple[int, int]:
        """(match length, position after the match) of the longest indexed n-gram ending ``query``;
        (0, -1) when none does."""
        for n, table in self.tables.items():
            if len(query) >= n:
                e = table.get(tuple(query[len(query) - n :]))
                if e is not None:
                    return n, e + 1
        return 0, -1
