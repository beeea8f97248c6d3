"""Page ownership between requests and the radix tree (or no tree: the naive baseline).

Every page is in exactly one place: the allocator's free list, the tree, or one request's
own pages.  ``check_integrity`` asserts that.
"""

from __future__ import annotations

from typing import NamedTuple

from runtime.hybrid_states import HybridStates
from runtime.page_allocator import OutOfPages, PageAllocator
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


class CacheManager:
    """Match, lock, allocate, insert and release pages for requests."""

    def __init__(
        self, num_pages: int, page_size: int, mode: str = "radix", states: HybridStates | None = None
    ) -> None:
        if mode not in ("radix", "off"):
            raise ValueError(f"prefix_cache must be 'radix' or 'off', got {mode!r}")
        self.page_size = page_size
        self.allocator = PageAllocator(num_pages)
        self.tree = RadixCache(page_size, self.allocator) if mode == "radix" else None
        self.live: set[Request] = set()
        self.states = states  # a hybrid model's linear-attention slots and snapshots

    # -- admission ---------------------------------------------------------------
    def admit(self, req: Request) -> None:
        """Reuse the longest cached prefix, leaving at least one token to compute (for logits)."""
        self.live.add(req)
        if self.tree is None:
            req.pages, req.num_tree_pages, req.num_computed = [], 0, 0
            if self.states is not None:
                self.states.admit(req, req.tokens, 0)
            if req.cached_tokens < 0:
                req.cached_tokens = 0
            return
        m = self.tree.match(req.tokens[: len(req.tokens) - 1])
        self.tree.lock(m.handle)
        n = m.cached_len
        if self.states is not None:  # cut back to the last snapshot: the KV after it is recomputed
            n = self.states.admit(req, req.tokens, m.cached_len)
        req.handle, req.pages = m.handle, list(m.pages[: n // self.page_size])
        req.num_tree_pages = len(req.pages)
        req.num_computed = n
        if req.cached_tokens < 0:  # a retracted request's own earlier work is not a cache hit
            req.cached_tokens = n

    def match_len(self, tokens: list[int]) -> int:
        if self.tree is None:
            return 0
        kv_len = self.tree.peek_len(tokens[: len(tokens) - 1])
        return kv_len if self.states is None else self.states.match_len(tokens, kv_len)

    # -- allocation -------------------------------------------------------------
    def pages_needed(self, req: Request, n_new: int) -> int:
        total = req.num_computed + n_new
        return max(0, -(-total // self.page_size) - len(req.pages))

    def available(self) -> int:
        evictable = self.tree.evictable_pages if self.tree is not None else 0
        return self.allocator.num_free + evictable

    def reserve(self, req: Request, n_new: int) -> bool:
        """Give ``req`` pages for ``n_new`` more tokens, evicting LRU tree pages if needed."""
        need = self.pages_needed(req, n_new)
        if need == 0:
            return True
        short = need - self.allocator.num_free
        if short > 0 and self.tree is not None:
            if self.tree.evict(short) and self.states is not None and self.states.snapshots is not None:
                self.states.snapshots.prune(self.tree.peek_len)  # snapshots go with their prefix's pages
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
        self._insert(req)
        if self.states is not None:
            self.states.inserted(req, req.num_tree_pages * self.page_size)

    def _insert(self, req: Request) -> None:
        assert self.tree is not None
        n_pages = req.num_computed // self.page_size
        if n_pages <= req.num_tree_pages:
            return
        n = n_pages * self.page_size
        res = self.tree.insert(req.tokens[:n], req.pages[:n_pages])
        dup_end = res.prefix_len // self.page_size
        if dup_end > req.num_tree_pages:
            self.allocator.free(req.pages[req.num_tree_pages : dup_end])
        m = self.tree.match(req.tokens[:n])
        assert m.cached_len == n, "a just-inserted prefix must match in full"
        self.tree.lock(m.handle)
        self.tree.unlock(req.handle)
        req.handle = m.handle
        req.pages[:n_pages] = m.pages
        req.num_tree_pages = n_pages

    def release(self, req: Request, cache: bool = True) -> None:
        """Finished, aborted or retracted: keep computed pages in the tree, free the rest."""
        if req not in self.live:
            return
        if cache:
            self.cache_computed(req)
        self.allocator.free(req.own_pages)
        if self.states is not None:
            self.states.release(req, req.num_tree_pages * self.page_size if cache else 0)
        if self.tree is not None and req.handle is not None:
            self.tree.unlock(req.handle)
        req.pages, req.num_tree_pages, req.handle, req.num_computed = [], 0, None, 0
        self.live.discard(req)

    def reset(self) -> None:
        if self.tree is not None:
            self.tree.reset()
        if self.states is not None and self.states.snapshots is not None:
            self.states.snapshots.reset()

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
        )

    def check_integrity(self) -> CacheStats:
        s = self.stats()
        if s.free_pages + s.tree_pages + s.request_pages != s.total_pages:
            raise AssertionError(f"KV page leak: {s}")
        if self.states is not None:
            self.states.check(self.live, self.tree.peek_len if self.tree is not None else lambda t: 0)
        return s
