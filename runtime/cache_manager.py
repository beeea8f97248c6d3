"""Page ownership between requests and the radix tree (or no tree: the naive baseline).

Every page is in exactly one place: the allocator's free list, the tree, or one request's
own pages.  ``check_integrity`` asserts that.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from runtime.cache_scope import PUBLIC, CacheScope
from runtime.eviction import DEFAULT_POLICY
from runtime.page_allocator import OutOfPages, PageAllocator
from runtime.pins import PinTable
from runtime.radix_cache import RadixCache
from runtime.request import Request


class CacheStats(NamedTuple):
    """Pool occupancy right now."""

    total_pages: int
    free_pages: int
    tree_pages: int
    evictable_pages: int
    request_pages: int
    evicted_pages: int
    pinned_pages: int = 0


class CacheManager:
    """Match, lock, allocate, insert and release pages for requests."""

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        mode: str = "radix",
        eviction: str = DEFAULT_POLICY,
        session_ttl: float = 300.0,
        pinned_fraction: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if mode not in ("radix", "off"):
            raise ValueError(f"prefix_cache must be 'radix' or 'off', got {mode!r}")
        self.page_size = page_size
        self.allocator = PageAllocator(num_pages)
        self.tree = RadixCache(page_size, self.allocator, eviction) if mode == "radix" else None
        budget = int(pinned_fraction * num_pages)
        self.pins = PinTable(self.tree, budget, session_ttl, clock) if self.tree is not None else None
        self.live: set[Request] = set()

    # -- admission ---------------------------------------------------------------
    def admit(self, req: Request) -> None:
        """Reuse the longest cached prefix, leaving at least one token to compute (for logits)."""
        self.live.add(req)
        if self.tree is None:
            req.pages, req.num_tree_pages, req.num_computed = [], 0, 0
            if req.cached_tokens < 0:
                req.cached_tokens = 0
            return
        if req.scope.session is not None:
            self.pins.touch(req.scope.session)  # the session is back: its TTL starts again
        m = self.tree.match(req.tokens[: len(req.tokens) - 1], req.scope.namespace, req.scope.public_len)
        self.tree.lock(m.handle)
        req.handle, req.pages, req.num_tree_pages = m.handle, list(m.pages), len(m.pages)
        req.num_computed = m.cached_len
        if req.cached_tokens < 0:  # a retracted request's own earlier work is not a cache hit
            req.cached_tokens = m.cached_len

    def match_len(self, tokens: list[int], scope: CacheScope = PUBLIC) -> int:
        if self.tree is None:
            return 0
        return self.tree.peek_len(tokens[: len(tokens) - 1], scope.namespace, scope.public_len)

    # -- allocation -------------------------------------------------------------
    def pages_needed(self, req: Request, n_new: int) -> int:
        total = req.num_computed + n_new
        return max(0, -(-total // self.page_size) - len(req.pages))

    def available(self) -> int:
        evictable = self.tree.evictable_pages if self.tree is not None else 0
        return self.allocator.num_free + evictable

    def reserve(self, req: Request, n_new: int) -> bool:
        """Give ``req`` pages for ``n_new`` more tokens, evicting tree pages if needed.

        Pins lapse, oldest first, only when evicting everything unpinned is not enough.
        """
        need = self.pages_needed(req, n_new)
        if need == 0:
            return True
        if need > self.allocator.num_free and self.tree is not None:
            self.pins.expire()
            self.tree.evict(need - self.allocator.num_free)
            while need > self.allocator.num_free and len(self.pins):
                self.pins.lapse_oldest("pressure")
                self.tree.evict(need - self.allocator.num_free)
        try:
            req.pages.extend(self.allocator.alloc(need))
        except OutOfPages:
            return False
        return True

    # -- insertion / release ------------------------------------------------------
    def cache_computed(self, req: Request) -> None:
        """Insert the request's whole computed pages into the tree and adopt the tree's pages.

        Pages another request inserted meanwhile for the same tokens replace ours (ours are freed).
        """
        if self.tree is None:
            return
        n_pages = req.num_computed // self.page_size
        if n_pages <= req.num_tree_pages:
            return
        n = n_pages * self.page_size
        res = self.tree.insert(req.tokens[:n], req.pages[:n_pages], req.scope.namespace, req.scope.public_len)
        dup_end = res.prefix_len // self.page_size
        if dup_end > req.num_tree_pages:
            self.allocator.free(req.pages[req.num_tree_pages : dup_end])
        # The insert's own handle, not a fresh match: a match would count as a use of the new
        # leaf for the eviction policy.
        self.tree.lock(res.handle)
        self.tree.unlock(req.handle)
        req.handle = res.handle
        tree_pages = self.tree.path_pages(res.handle)
        assert len(tree_pages) == n_pages, "the insert's handle must end the inserted prefix"
        req.pages[:n_pages] = tree_pages
        req.num_tree_pages = n_pages

    def release(self, req: Request, cache: bool = True) -> None:
        """Finished, aborted or retracted: keep computed pages in the tree, free the rest."""
        if req not in self.live:
            return
        if cache:
            self.cache_computed(req)
            session = req.scope.session
            if session is not None and req.handle is not None and req.handle is not self.tree.root:
                self.pins.pin(session, req.handle)  # the session's last node: prompt + output
        self.allocator.free(req.own_pages)
        if self.tree is not None and req.handle is not None:
            self.tree.unlock(req.handle)
        req.pages, req.num_tree_pages, req.handle, req.num_computed = [], 0, None, 0
        self.live.discard(req)

    def reset(self) -> None:
        if self.tree is not None:
            self.pins.clear()
            self.tree.reset()

    # -- accounting ------------------------------------------------------------------
    def stats(self) -> CacheStats:
        tree_pages = self.tree.total_pages if self.tree is not None else 0
        return CacheStats(
            total_pages=self.allocator.num_pages,
            free_pages=self.allocator.num_free,
            tree_pages=tree_pages,
            evictable_pages=self.tree.evictable_pages if self.tree is not None else 0,
            request_pages=sum(len(r.own_pages) for r in self.live),
            evicted_pages=getattr(self.tree, "evicted_pages_total", 0) if self.tree is not None else 0,
            pinned_pages=self.tree.pinned_pages if self.tree is not None else 0,
        )

    def check_integrity(self) -> CacheStats:
        s = self.stats()
        if s.free_pages + s.tree_pages + s.request_pages != s.total_pages:
            raise AssertionError(f"KV page leak: {s}")
        if self.pins is not None:
            self.pins.check()  # pinned pages: re-derived from the pins, inside the tree, within budget
        return s
