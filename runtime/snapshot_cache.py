"""Linear-attention state snapshots at page boundaries of cached prefixes, LRU within a byte budget.

A snapshot is keyed by the prefix it follows: ``(length, chain hash of its pages)``, the hash
chained page by page so every page boundary of a prompt is keyed in one pass.  The prefix's
tokens are kept beside it to rule out a hash collision and to check, after the radix tree
evicts, that the KV pages of the prefix are still cached (a snapshot without them is useless and
is dropped with them).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
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


CachedLen = Callable[
    [list[int], Hashable, int], int
]  # the prefix cache's peek_len(tokens, namespace, public_len)


class Entry(NamedTuple):
    tokens: tuple[int, ...]
    snap: Snapshot
    namespace: Hashable  # the tenant whose KV pages the prefix is in (None: public)
    public_len: int


class SnapshotCache:
    """``put`` a snapshot for a whole-page prefix; ``lookup`` the longest one under a length.

    Keys include the tenant's namespace, so a tenant only resumes from states of its own prefixes.
    """

    def __init__(self, page_size: int, budget_bytes: int) -> None:
        self.page_size = page_size
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[tuple[int, int, Hashable], Entry] = OrderedDict()
        self.nbytes = 0
        self._stored = self._evicted = self._dropped = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(
        self, tokens: Sequence[int], max_len: int, namespace: Hashable = None
    ) -> tuple[int, Snapshot | None]:
        """The longest snapshotted prefix of ``tokens`` no longer than ``max_len``: (its length, snapshot)."""
        for n, h in reversed(page_keys(tokens, self.page_size, max_len)):
            hit = self._entries.get((n, h, namespace))
            if hit is not None and list(hit.tokens) == list(tokens[:n]):
                self._entries.move_to_end((n, h, namespace))
                return n, hit.snap
        return 0, None

    def put(
        self, tokens: Sequence[int], snap: Snapshot, namespace: Hashable = None, public_len: int = 0
    ) -> bool:
        """Keep ``snap`` as the state after ``tokens`` (whole pages); False when it cannot fit the budget."""
        n = len(tokens)
        assert n > 0 and n % self.page_size == 0, "snapshots sit at page boundaries"
        if snap.nbytes > self.budget_bytes:
            return False
        key = (*page_keys(tokens, self.page_size, n)[-1], namespace)
        if key in self._entries:
            self._entries.move_to_end(key)
            return True
        while self._entries and self.nbytes + snap.nbytes > self.budget_bytes:
            self._remove(next(iter(self._entries)))
            self._evicted += 1
        self._entries[key] = Entry(tuple(tokens), snap, namespace, public_len)
        self.nbytes += snap.nbytes
        self._stored += 1
        return True

    def prune(self, cached_len: CachedLen) -> int:
        """Drop snapshots whose prefix no longer has its KV pages (``cached_len(...) < len(tokens)``)."""
        gone = [k for k, e in self._entries.items() if not _has_pages(cached_len, e)]
        for k in gone:
            self._remove(k)
        self._dropped += len(gone)
        return len(gone)

    def reset(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def _remove(self, key: tuple[int, int, Hashable]) -> None:
        self.nbytes -= self._entries.pop(key).snap.nbytes

    def stats(self) -> SnapshotStats:
        return SnapshotStats(
            len(self._entries), self.nbytes, self.budget_bytes, self._stored, self._evicted, self._dropped
        )

    def check(self, cached_len: CachedLen) -> None:
        """Integrity: the byte count adds up, the budget holds, every prefix still has its KV pages."""
        total = sum(e.snap.nbytes for e in self._entries.values())
        if total != self.nbytes or total > self.budget_bytes:
            raise AssertionError(f"snapshot accounting: {total} bytes held, {self.nbytes} counted")
        for e in self._entries.values():
            if not _has_pages(cached_len, e):
                raise AssertionError(f"a snapshot at {len(e.tokens)} tokens outlived its KV pages")


def _has_pages(cached_len: CachedLen, e: Entry) -> bool:
    return cached_len(list(e.tokens), e.namespace, e.public_len) >= len(e.tokens)
