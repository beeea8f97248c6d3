"""Linear-attention state snapshots at page boundaries of cached prefixes, LRU within a byte budget.

A snapshot is keyed by the prefix it follows: ``(length, chain hash of its pages)``, the hash
chained page by page so every page boundary of a prompt is keyed in one pass.  The prefix's
tokens are kept beside it to rule out a hash collision and to check, after the radix tree
evicts, that the KV pages of the prefix are still cached (a snapshot without them is useless and
is dropped with them).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import NamedTuple

from runtime.state_pool import Snapshot


class SnapshotStats(NamedTuple):
    count: int
    bytes: int
    budget_bytes: int
    stored: int  # totals since start
    evicted: int
    dropped: int  # freed because the tree evicted their prefix's pages


def page_keys(tokens: Sequence[int], page_size: int, upto: int) -> list[tuple[int, int]]:
    """``(n, hash)`` of every whole-page prefix ``tokens[:n]``, ``0 < n <= upto``, shortest first."""
    keys, h = [], 0
    for n in range(page_size, upto + 1, page_size):
        h = hash((h, tuple(tokens[n - page_size : n])))
        keys.append((n, h))
    return keys


class SnapshotCache:
    """``put`` a snapshot for a whole-page prefix; ``lookup`` the longest one under a length."""

    def __init__(self, page_size: int, budget_bytes: int) -> None:
        self.page_size = page_size
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[tuple[int, int], tuple[tuple[int, ...], Snapshot]] = OrderedDict()
        self.nbytes = 0
        self._stored = self._evicted = self._dropped = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: Sequence[int], max_len: int) -> tuple[int, Snapshot | None]:
        """The longest snapshotted prefix of ``tokens`` no longer than ``max_len``: (its length, snapshot)."""
        for key in reversed(page_keys(tokens, self.page_size, max_len)):
            hit = self._entries.get(key)
            if hit is not None and list(hit[0]) == list(tokens[: key[0]]):
                self._entries.move_to_end(key)
                return key[0], hit[1]
        return 0, None

    def has(self, tokens: Sequence[int]) -> bool:
        keys = page_keys(tokens, self.page_size, len(tokens))
        return bool(keys) and keys[-1] in self._entries

    def put(self, tokens: Sequence[int], snap: Snapshot) -> bool:
        """Keep ``snap`` as the state after ``tokens`` (whole pages); False when it cannot fit the budget."""
        n = len(tokens)
        assert n > 0 and n % self.page_size == 0, "snapshots sit at page boundaries"
        if snap.nbytes > self.budget_bytes:
            return False
        key = page_keys(tokens, self.page_size, n)[-1]
        if key in self._entries:
            self._entries.move_to_end(key)
            return True
        while self._entries and self.nbytes + snap.nbytes > self.budget_bytes:
            self._remove(next(iter(self._entries)))
            self._evicted += 1
        self._entries[key] = (tuple(tokens), snap)
        self.nbytes += snap.nbytes
        self._stored += 1
        return True

    def prune(self, cached_len: Callable[[list[int]], int]) -> int:
        """Drop snapshots whose prefix no longer has its KV pages (``cached_len(tokens) < len(tokens)``)."""
        gone = [k for k, (toks, _) in self._entries.items() if cached_len(list(toks)) < len(toks)]
        for k in gone:
            self._remove(k)
        self._dropped += len(gone)
        return len(gone)

    def reset(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def _remove(self, key: tuple[int, int]) -> None:
        _, snap = self._entries.pop(key)
        self.nbytes -= snap.nbytes

    def stats(self) -> SnapshotStats:
        return SnapshotStats(
            len(self._entries), self.nbytes, self.budget_bytes, self._stored, self._evicted, self._dropped
        )

    def check(self, cached_len: Callable[[list[int]], int]) -> None:
        """Integrity: the byte count adds up, the budget holds, every prefix still has its KV pages."""
        total = sum(s.nbytes for _, s in self._entries.values())
        if total != self.nbytes or total > self.budget_bytes:
            raise AssertionError(f"snapshot accounting: {total} bytes held, {self.nbytes} counted")
        for toks, _ in self._entries.values():
            if cached_len(list(toks)) < len(toks):
                raise AssertionError(f"a snapshot at {len(toks)} tokens outlived its KV pages")
