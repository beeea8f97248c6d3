"""What the cache manager needs from a prefix cache, and the two caches behind it.

A prefix cache maps page-aligned token prefixes to KV pages of the pool.  The cache manager
talks to it only through this interface, so the naive baseline (``NoPrefixCache``: remembers
nothing) and the radix tree (``runtime.cache.radix_cache.RadixCache``) run the same code path:

* ``match(tokens) -> MatchResult(handle, cached_len, pages)``: the longest cached whole-page prefix.
  ``pages`` are pool pages ready to read; ``handle`` names that prefix for ``lock`` / ``unlock``.
* ``peek_len(tokens)``: ``match(...).cached_len`` without side effects (scheduling estimates).
* ``lock(handle)`` / ``unlock(handle)``: a locked prefix is never evicted.
* ``insert(tokens, pages) -> InsertResult(prefix_len, handle)``: offer whole pages.  The first
  ``prefix_len`` tokens were already cached: the caller keeps (and frees) its own pages for them;
  the cache adopts the rest, if it keeps anything at all.  A later ``match`` says which pages the
  cache holds for the key (none, for ``NoPrefixCache``).
* ``evict(n_pages) -> freed``, ``evictable_pages``, ``stats()``, ``reset()``.
* ``pin(handle)`` / ``unpin(handle)``: a lock counted in ``stats().pinned_pages`` (``runtime/cache/pins.py``
  gives pins owners, TTLs and a budget); ``handle_len(handle)``: tokens the handle's prefix holds.
* ``match``, ``peek_len`` and ``insert`` take the request's ``namespace`` and ``public_len``
  (``runtime/cache/scope.py``): a prefix computed in one namespace never matches in another.

Room left for what comes next, without changing callers (see docs/architecture.md):

* a lower tier (pages not in the pool but loadable from host memory or disk) lives *inside* a cache:
  ``match`` loads the loadable part of the prefix into pool pages it allocates from the allocator it
  was built with, so ``pages`` are always in the pool; ``evict`` may demote a page instead of dropping
  it.  ``PrefixCacheStats`` then grows fields; callers read them by name.
* per-node extra state (a recurrent-state snapshot for hybrid models, ``runtime/cache/node_states.py``)
  hangs off the cached node it ends: ``insert(..., extra=[(n, state)])`` offers the state after the
  first ``n`` tokens; a cache that keeps states returns from ``match`` the longest prefix that has
  both its pages and a state at its end (``MatchResult.state``; ``cut_len`` says how much longer the
  KV match was).  ``check()`` asserts the cache's own accounting (the states' bytes and budget).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple, Protocol


class MatchResult(NamedTuple):
    """Longest cached whole-page prefix of a token sequence.

    ``host_len`` / ``disk_len``: how many of the ``cached_len`` tokens a tiered cache loaded from
    its host / disk tier for this match (the rest were already in the pool).  ``state``: the extra
    state at the prefix's end (None: none kept, or the empty prefix); ``cut_len``: KV-matched
    tokens past ``cached_len`` that were cut back because no state ends there (diagnostics).
    """

    handle: object
    cached_len: int
    pages: list[int]
    host_len: int = 0
    disk_len: int = 0
    state: object = None
    cut_len: int = 0


class InsertResult(NamedTuple):
    """Outcome of an insert: tokens already present before it, the handle ending the key, and the
    pages the cache holds for the key now (its own for the first ``prefix_len`` tokens, the
    adopted rest; empty when it keeps nothing)."""

    prefix_len: int
    handle: object
    pages: list[int]


class PrefixCacheStats(NamedTuple):
    """Pages the cache holds now, how many could be evicted, pages evicted so far, pinned pages, pins,
    per-node extra states held and their bytes."""

    cached_pages: int
    evictable_pages: int
    evicted_pages: int
    pinned_pages: int = 0
    pins: int = 0
    states: int = 0
    state_bytes: int = 0


class PrefixCache(Protocol):
    """The interface above; see the module docstring for the ownership rules."""

    page_size: int

    @property
    def evictable_pages(self) -> int: ...

    def match(
        self, token_ids: Sequence[int], namespace: Hashable = None, public_len: int = 0
    ) -> MatchResult: ...

    def peek_len(self, token_ids: Sequence[int], namespace: Hashable = None, public_len: int = 0) -> int: ...

    def lock(self, handle: object) -> None: ...

    def unlock(self, handle: object) -> None: ...

    def pin(self, handle: object) -> None: ...

    def unpin(self, handle: object) -> None: ...

    def handle_len(self, handle: object) -> int: ...

    def insert(
        self,
        token_ids: Sequence[int],
        pages: Sequence[int],
        namespace: Hashable = None,
        public_len: int = 0,
        extra: Sequence[tuple[int, object]] = (),
    ) -> InsertResult: ...

    def evict(self, n_pages: int) -> int: ...

    def reset(self) -> None: ...

    def stats(self) -> PrefixCacheStats: ...

    def check(self) -> None: ...


class NoPrefixCache:
    """The naive baseline: caches nothing, so every prompt is computed in full."""

    ROOT = object()  # the one handle: the empty prefix

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size

    @property
    def evictable_pages(self) -> int:
        return 0

    def match(self, token_ids: Sequence[int], namespace: Hashable = None, public_len: int = 0) -> MatchResult:
        return MatchResult(self.ROOT, 0, [])

    def peek_len(self, token_ids: Sequence[int], namespace: Hashable = None, public_len: int = 0) -> int:
        return 0

    def lock(self, handle: object) -> None:
        pass

    def unlock(self, handle: object) -> None:
        pass

    def pin(self, handle: object) -> None:
        pass

    def unpin(self, handle: object) -> None:
        pass

    def handle_len(self, handle: object) -> int:
        return 0

    def insert(
        self,
        token_ids: Sequence[int],
        pages: Sequence[int],
        namespace: Hashable = None,
        public_len: int = 0,
        extra: Sequence[tuple[int, object]] = (),
    ) -> InsertResult:
        return InsertResult(0, self.ROOT, [])  # adopts nothing: the caller keeps every page

    def evict(self, n_pages: int) -> int:
        return 0

    def reset(self) -> None:
        pass

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(0, 0, 0)

    def check(self) -> None:
        pass
