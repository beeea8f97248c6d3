"""What the cache manager needs from a prefix cache, and the two caches behind it.

A prefix cache maps page-aligned token prefixes to KV pages of the pool.  The cache manager
talks to it only through this interface, so the naive baseline (``NoPrefixCache``: remembers
nothing) and the radix tree (``kvreuse.runtime.cache.radix_cache.RadixCache``) run the same code path:

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
* ``match``, ``peek_len``, ``insert`` and ``prefetch`` take the request's ``CacheScope``
  (``runtime/request.py``: namespace and public prefix): a prefix computed in one namespace
  never matches in another.
* Lower tiers (pages not in the pool but loadable from host memory or disk) live *inside* a cache
  (``kvreuse.runtime.cache.tiered_cache``): ``match`` loads the loadable part of the prefix into pool pages it
  allocates from the allocator it was built with, so ``pages`` are always in the pool; ``evict`` may
  demote a page instead of dropping it.  ``persist(wait)`` writes the pool-only pages down,
  ``prefetch(tokens, scope)`` starts reading a queued request's pages (a Future, or None),
  ``load_stored()`` prewarms the pool from the store; a cache without tiers answers 0 / None, so the
  cache manager never asks which cache it has.
* per-node extra state (a recurrent-state snapshot for hybrid models, ``runtime/cache/node_states.py``)
  hangs off the cached node it ends: ``insert(..., extra=[(n, state)])`` offers the state after the
  first ``n`` tokens; a cache that keeps states returns from ``match`` the longest prefix that has
  both its pages and a state at its end (``MatchResult.state``; ``cut_len`` says how much longer the
  KV match was).  ``check()`` asserts the cache's own accounting (the states' bytes and budget).
* events (``runtime/cache/events.py``): ``listen(events)`` makes ``events`` the hook told of every
  node stored and evicted and every reset (False: this cache stores nothing, so it never tells);
  ``announce(events)`` tells ``events`` every node held now, parents first, as if each were just
  stored (a new listener's starting picture).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, NamedTuple, Protocol

from kvreuse.runtime.request import PUBLIC, CacheScope

if TYPE_CHECKING:
    from kvreuse.runtime.cache.events import CacheEvents


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
    shared_len: int = 0  # of cached_len: loaded from the shared tier (a store other replicas write too)


class InsertResult(NamedTuple):
    """Outcome of an insert: tokens already present before it, the handle ending the key, and the
    pages the cache holds for the key now (its own for the first ``prefix_len`` tokens, the
    adopted rest; empty when it keeps nothing)."""

    prefix_len: int
    handle: object
    pages: list[int]


class CacheStats(NamedTuple):
    """Pool occupancy right now."""

    total_pages: int
    free_pages: int
    tree_pages: int
    evictable_pages: int
    request_pages: int
    evicted_pages: int
    pinned_pages: int = 0
    snapshots: int = 0  # per-node states held (a hybrid's or window model's snapshots) and their bytes
    snapshot_bytes: int = 0


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

    def match(self, token_ids: Sequence[int], scope: CacheScope = PUBLIC) -> MatchResult: ...

    def peek_len(self, token_ids: Sequence[int], scope: CacheScope = PUBLIC) -> int: ...

    def lock(self, handle: object) -> None: ...

    def unlock(self, handle: object) -> None: ...

    def pin(self, handle: object) -> None: ...

    def unpin(self, handle: object) -> None: ...

    def handle_len(self, handle: object) -> int: ...

    def finished(self, handle: object, num_prompt: int, num_output: int) -> None: ...

    def insert(
        self,
        token_ids: Sequence[int],
        pages: Sequence[int],
        scope: CacheScope = PUBLIC,
        extra: Sequence[tuple[int, object]] = (),
    ) -> InsertResult: ...

    def evict(self, n_pages: int) -> int: ...

    def reset(self) -> None: ...

    def stats(self) -> PrefixCacheStats: ...

    def check(self) -> None: ...

    def listen(self, events: CacheEvents) -> bool: ...

    def announce(self, events: CacheEvents) -> None: ...

    def persist(self, wait: bool = True) -> int: ...

    def prefetch(self, token_ids: Sequence[int], scope: CacheScope = PUBLIC) -> Future | None: ...

    def load_stored(self) -> int: ...


class NoTiers:
    """The tier operations of a cache with nothing below the pool: nothing to write, read or load."""

    def persist(self, wait: bool = True) -> int:
        return 0

    def prefetch(self, token_ids: Sequence[int], scope: CacheScope = PUBLIC) -> Future | None:
        return None

    def load_stored(self) -> int:
        return 0


class NoPrefixCache(NoTiers):
    """The naive baseline: caches nothing, so every prompt is computed in full."""

    ROOT = object()  # the one handle: the empty prefix

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size

    @property
    def evictable_pages(self) -> int:
        return 0

    def match(self, token_ids: Sequence[int], scope: CacheScope = PUBLIC) -> MatchResult:
        return MatchResult(self.ROOT, 0, [])

    def peek_len(self, token_ids: Sequence[int], scope: CacheScope = PUBLIC) -> int:
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

    def finished(self, handle: object, num_prompt: int, num_output: int) -> None:
        pass

    def insert(
        self,
        token_ids: Sequence[int],
        pages: Sequence[int],
        scope: CacheScope = PUBLIC,
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

    def listen(self, events: CacheEvents) -> bool:
        return False  # nothing is ever stored, so there is nothing to tell

    def announce(self, events: CacheEvents) -> None:
        pass
