"""Page ownership between requests and the prefix cache.

Every page is in exactly one place: the allocator's free list, the prefix cache, or one request's
own pages.  ``check_integrity`` asserts that.  The cache manager speaks only the
``kvreuse.runtime.cache.prefix_cache.PrefixCache`` interface, so the radix tree and the naive baseline (no cache)
run one code path; a hybrid model's linear-attention states go through the same calls (``states``:
``StateSlots`` or, for a model without per-request state, ``NoStateSlots``; their snapshots ride on ``insert`` / ``match``).

Its public methods are the cache's whole interface above ``runtime/cache/`` (nothing reaches through
it to its parts: ``tests/test_cache_wall.py``): requests' pages and state inputs, pins, events
(``listen``, ``announce``), shadows, the tiers (``tick``: the persist clock) and figures.  Tier
presence is decided once, here: without tiers ``tiers`` is ``NoLowerTiers``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from kvreuse.runtime.cache.events import CacheEvents
from kvreuse.runtime.cache.eviction import DEFAULT_POLICY
from kvreuse.runtime.cache.page_allocator import OutOfPages, PageAllocator
from kvreuse.runtime.cache.pins import PinInfo, PinTable
from kvreuse.runtime.cache.prefix_cache import CacheStats, PrefixCache
from kvreuse.runtime.cache.registry import DEFAULT_KIND, POLICY_KIND, cache_kind, make_prefix_cache
from kvreuse.runtime.cache.shadows import NoShadows, Shadows, ShadowStats
from kvreuse.runtime.cache.state_slots import NoStateSlots, StateSlots
from kvreuse.runtime.cache.store.states import StateTier
from kvreuse.runtime.cache.store.tiers import LowerTiers, NoLowerTiers, TierStats
from kvreuse.runtime.cache.tiered_cache import PageIO
from kvreuse.runtime.request import PUBLIC, CacheScope, Request
from kvreuse.runtime.runner.model_state import StateInput
from kvreuse.runtime.sampling.params import SamplingParams

_SHADOW_PARAMS = SamplingParams(max_tokens=1)  # a replayed request samples nothing


class CacheManager:
    """Match, lock, allocate, insert and release pages for requests."""

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        prefix_cache: str = DEFAULT_KIND,
        eviction: str = DEFAULT_POLICY,
        session_ttl: float = 300.0,
        pinned_fraction: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        tiers: LowerTiers | None = None,
        io: PageIO | None = None,
        write_through: bool = False,
        states: StateSlots | NoStateSlots = NoStateSlots(),
        state_budget: int | None = None,
        state_tier: StateTier | None = None,
        shadows: Sequence[str] = (),
        chunk_size: int = 512,
        persist_every_s: float = 60.0,
    ) -> None:
        """``shadows``: policies to replay each finished request under (``runtime/cache/shadows.py``),
        chunk by chunk of ``chunk_size`` tokens as the scheduler prefills.  ``persist_every_s``: how
        often :meth:`tick` writes pool-only pages to the disk tier."""
        if shadows and state_budget is not None:
            raise ValueError("eviction shadows model a full-attention pool: this model keeps per-node states")
        self.page_size = page_size
        self._keeps_prefixes = cache_kind(prefix_cache).keeps_prefixes
        self.allocator = PageAllocator(num_pages)
        self.prefix: PrefixCache = make_prefix_cache(
            prefix_cache, page_size, self.allocator, eviction, tiers, io, write_through, state_budget,
            state_tier, states.splice_span,
        )  # fmt: skip
        self.pins = PinTable(self.prefix, int(pinned_fraction * num_pages), session_ttl, clock)
        self.tiers: LowerTiers | NoLowerTiers = tiers if tiers is not None else NoLowerTiers()
        self._persist_every_s = persist_every_s
        self._next_persist = time.monotonic() + persist_every_s
        self._closed = False
        self._loads: dict[Request, object] = {}  # waiting requests whose disk pages are being read ahead
        self.live: set[Request] = set()
        self.states = states  # the running requests' slots of a hybrid's states or a window model's rings
        # other policies' hits on the same requests (``runtime/cache/shadows.py``)
        self.shadows = make_shadows(shadows, num_pages, page_size, chunk_size, session_ttl, pinned_fraction)

    @property
    def caches_prefixes(self) -> bool:
        """Whether this cache keeps anything (``--prefix-cache off``: the naive baseline)."""
        return self._keeps_prefixes

    # -- admission ---------------------------------------------------------------
    def admit(self, req: Request) -> None:
        """Reuse the longest cached prefix, leaving at least one token to compute (for logits)."""
        self.live.add(req)
        if req.scope.session is not None:
            self.pins.touch(req.scope.session)  # the session is back: its TTL starts again
        t0 = time.perf_counter()
        m = self.prefix.match(req.tokens[: len(req.tokens) - 1], req.scope)
        load_s = (
            time.perf_counter() - t0 if m.host_len or m.disk_len or m.shared_len else 0.0
        )  # a tier's pages copied in
        self.prefix.lock(m.handle)
        req.handle, req.pages = m.handle, list(m.pages)
        req.num_tree_pages = len(req.pages)
        req.num_computed = m.cached_len
        self.states.admit(req, m.state, m.cached_len + m.cut_len)
        if req.cached_tokens < 0:  # a retracted request's own earlier work is not a cache hit
            req.cached_tokens = m.cached_len
            req.cached_host_tokens, req.cached_disk_tokens = m.host_len, m.disk_len
            req.cached_shared_tokens = m.shared_len
            req.snapshot_cut = m.cut_len
            req.tier_load_s = load_s

    def match_len(self, tokens: list[int], scope: CacheScope = PUBLIC) -> int:
        return self.prefix.peek_len(tokens[: len(tokens) - 1], scope)

    # -- allocation -------------------------------------------------------------
    def pages_needed(self, req: Request, n_new: int) -> int:
        total = req.num_computed + n_new
        return max(0, -(-total // self.page_size) - len(req.pages))

    def available(self) -> int:
        return self.allocator.num_free + self.prefix.evictable_pages

    def reserve(self, req: Request, n_new: int) -> bool:
        """Give ``req`` pages for ``n_new`` more tokens, evicting cached pages if needed.

        Pins lapse (see ``PinTable.lapse_for``) only when evicting everything unpinned is not enough.
        """
        need = self.pages_needed(req, n_new)
        if need == 0:
            return True
        if need > self.allocator.num_free:
            self.pins.expire()
            self.prefix.evict(need - self.allocator.num_free)
            others = self._held_by_requests() > len(req.pages) - req.num_tree_pages
            while need > self.allocator.num_free and self.pins.lapse_for(req.scope.namespace, others):
                self.prefix.evict(need - self.allocator.num_free)
        try:
            req.pages.extend(self.allocator.alloc(need))
        except OutOfPages:
            return False
        return True

    def _held_by_requests(self) -> int:
        """Pages running requests own (neither free nor the cache's): they come back as requests end."""
        return self.allocator.num_pages - self.allocator.num_free - self.prefix.stats().cached_pages

    def trim(self, req: Request) -> None:
        """Free ``req``'s own pages past its computed tokens (a rejected draft's)."""
        keep = max(req.num_tree_pages, -(-req.num_computed // self.page_size))
        if len(req.pages) > keep:
            self.allocator.free(req.pages[keep:])
            del req.pages[keep:]

    def unreserve(self, req: Request) -> None:
        """Free the pages :meth:`reserve` gave a request never admitted (a prompt's scoring scratch)."""
        self.allocator.free(req.pages)
        req.pages = []

    # -- per-request model state (a hybrid's or window model's slots) ---------------------
    def state_input(
        self, chunks: list[tuple[Request, int, int]], drafted: list[int] | None = None
    ) -> StateInput | None:
        """The runner's view of a step's ``(request, start, length)`` chunks' state slots (None: dense)."""
        return self.states.step_input(chunks, drafted)

    def settle(self, accepted: dict[Request, int]) -> None:
        """After a step that verified drafts: each request's state back to its last accepted token."""
        self.states.settle(accepted)

    # -- insertion / release ------------------------------------------------------
    def cache_computed(self, req: Request, leaving: bool = False) -> None:
        """Offer the request's whole computed pages (and, for hybrids, the states at their boundaries)
        to the cache and adopt the cache's pages.

        Pages another request inserted meanwhile for the same tokens replace ours (ours are freed).
        """
        n_pages = req.num_computed // self.page_size
        n = n_pages * self.page_size
        extra = self.states.take(req, n, leaving)
        if n_pages <= req.num_tree_pages and not extra:
            return
        res = self.prefix.insert(req.tokens[:n], req.pages[:n_pages], req.scope, extra)
        dup_end = res.prefix_len // self.page_size
        if dup_end > req.num_tree_pages:
            self.allocator.free(req.pages[req.num_tree_pages : dup_end])
        self.prefix.lock(res.handle)
        self.prefix.unlock(req.handle)
        req.handle = res.handle
        req.pages[: len(res.pages)] = res.pages
        req.num_tree_pages = len(res.pages)

    def release(self, req: Request, cache: bool = True) -> None:
        """Finished, aborted or retracted: keep computed pages in the cache, free the rest."""
        self._loads.pop(req, None)
        if req not in self.live:
            return
        if cache:
            self.cache_computed(req, leaving=True)
            self.prefix.finished(req.handle, req.num_prompt, len(req.tokens) - req.num_prompt)
            if req.scope.session is not None:
                self.pins.pin(req.scope.session, req.handle)  # the session's last node: prompt + output
        self.allocator.free(req.own_pages)
        self.states.release(req)
        self.prefix.unlock(req.handle)
        req.pages, req.num_tree_pages, req.handle, req.num_computed = [], 0, None, 0
        self.live.discard(req)

    def finish(self, req: Request) -> None:
        """``req`` ended for good (not a retraction): the shadows replay it, then :meth:`release`."""
        if req in self.live:
            self.shadows.replay(req.tokens, req.num_prompt, req.num_computed, req.cached_tokens, req.scope)
        self.release(req)

    def replay(
        self, tokens: Sequence[int], num_prompt: int, num_computed: int, scope: CacheScope, chunk_size: int
    ) -> int:
        """Run one finished request alone through this manager, call for call as the scheduler runs one
        (admit, prefill chunk by chunk, decode a token at a time, release), with ``num_computed`` of its
        ``tokens`` computed: an eviction shadow's step (``runtime/cache/shadows.py``).  Returns the
        tokens it found cached."""
        req = Request(
            "shadow", list(tokens[:num_prompt]), num_prompt, _SHADOW_PARAMS, frozenset(), scope=scope
        )
        self.admit(req)
        prefill = min(num_prompt, num_computed)  # an abort mid-prefill computed less
        while req.num_computed < prefill:
            n = min(chunk_size, prefill - req.num_computed)
            if not self.reserve(req, n):
                break  # the pool cannot hold it: keep what it computed
            req.num_computed += n
            if n > 1 or req.num_computed < num_prompt:  # the scheduler's rule: a sampled 1-token chunk
                self.cache_computed(req)
        if req.num_computed == num_prompt:  # prefilled: decode a token at a time
            req.tokens += tokens[num_prompt : num_prompt + 1]
            while req.num_computed < min(num_computed, len(tokens)) and self.reserve(req, 1):
                req.num_computed += 1
                req.tokens += tokens[len(req.tokens) : len(req.tokens) + 1]
        req.tokens += tokens[len(req.tokens) :]
        self.release(req)
        return req.cached_tokens

    def reset(self) -> None:
        self.pins.clear()
        self.prefix.reset()
        self.shadows.reset()

    # -- pins -------------------------------------------------------------------------
    def pin_prefix(
        self, owner: object, ids: list[int], scope: CacheScope, ttl: float | None
    ) -> tuple[int, bool]:
        """Pin the cached part of ``ids`` (in ``scope``) for ``ttl`` seconds under ``owner``, within the pin
        budget; returns (tokens the pin covers, whether it was taken)."""
        handle = self.prefix.match(ids, scope).handle
        return self.prefix.handle_len(handle), self.pins.pin(owner, handle, ttl)

    def unpin(self, owner: object) -> None:
        self.pins.unpin(owner)

    def is_pinned(self, owner: object) -> bool:
        return owner in self.pins

    def pin_report(self) -> tuple[list[PinInfo], dict[str, int], dict[object, dict[str, int]]]:
        """The live pins (owner, tokens, TTL left), the pins lapsed so far by cause, and by tenant."""
        table = self.pins
        return table.info(), dict(table.lapsed), {t: dict(c) for t, c in table.lapsed_by.items()}

    # -- events and shadows -----------------------------------------------------------------
    def listen(self, events: CacheEvents) -> bool:
        """Make ``events`` the hook told of every node stored and evicted and every reset (only before
        requests run, or between steps); False when this cache's kind stores nothing to tell of."""
        return self.prefix.listen(events)

    def announce(self, events: CacheEvents) -> None:
        """Tell ``events`` every node cached now, parents first (between steps): a new listener's picture."""
        self.prefix.announce(events)

    def shadow_stats(self) -> ShadowStats | None:
        """What each ``--eviction-shadows`` policy would have served of the same requests (None: no shadows)."""
        return self.shadows.stats()

    def predictor_stats(self) -> dict | None:
        """The eviction policy's learned figures (``predict``: kept vs evicted return rates); None for a
        policy that learns nothing, or no prefix cache."""
        policy = getattr(self.prefix, "policy", None)  # NoPrefixCache has none
        return policy.predictor() if policy is not None else None

    # -- lower tiers -------------------------------------------------------------------
    def tick(self) -> None:
        """Between steps: every ``persist_every_s`` start writing pool-only pages to the disk tier (a
        cache without tiers writes nothing)."""
        now = time.monotonic()
        if now >= self._next_persist:
            self._next_persist = now + self._persist_every_s
            self.persist(wait=False)

    def persist(self, wait: bool = True) -> int:
        """Write every cached page that is only in the pool to the disk tier; returns pages written."""
        return self.prefix.persist(wait)

    def prefetch(self, req: Request) -> None:
        """A request was queued: start reading its disk-tier pages in the background."""
        fut = self.prefix.prefetch(req.tokens[: len(req.tokens) - 1], req.scope)
        if fut is not None:
            self._loads[req] = fut

    def loading(self, req: Request, wait: bool = False) -> bool:
        """Whether ``req``'s read-ahead is still running (``wait``: finish it first)."""
        fut = self._loads.get(req)
        if fut is None:
            return False
        if wait:
            fut.result()
        if fut.done():
            del self._loads[req]
            return False
        return True

    def load_stored(self) -> int:
        """Load stored prefixes from the disk tier into the pool while it has free pages; returns tokens."""
        return self.prefix.load_stored()

    def close(self) -> None:
        """Persist and close the lower tiers (shutdown; idempotent); the engine runs nothing after this."""
        if self._closed:
            return
        self._closed = True
        self.persist()
        self.tiers.close()

    def tier_stats(self) -> TierStats | None:
        """Lower-tier counters, or None without tiers."""
        return self.tiers.stats()

    def tier_error(self) -> str | None:
        """Why a lower tier runs degraded (disk read-only, shared store unreachable), or None; thread-safe."""
        return self.tiers.error

    @property
    def num_pages(self) -> int:
        """The pool's pages (readable from any thread)."""
        return self.allocator.num_pages

    # -- accounting ------------------------------------------------------------------
    def stats(self, expire_pins: bool = False) -> CacheStats:
        """Pages by owner now (``expire_pins``: pins past their TTL dropped first, as a report wants)."""
        if expire_pins:
            self.pins.expire()
        ps = self.prefix.stats()
        return CacheStats(
            total_pages=self.allocator.num_pages,
            free_pages=self.allocator.num_free,
            tree_pages=ps.cached_pages,
            evictable_pages=ps.evictable_pages,
            request_pages=sum(len(r.own_pages) for r in self.live),
            evicted_pages=ps.evicted_pages,
            pinned_pages=ps.pinned_pages,
            snapshots=ps.states,
            snapshot_bytes=ps.state_bytes,
        )

    def check_integrity(self) -> CacheStats:
        s = self.stats()
        if s.free_pages + s.tree_pages + s.request_pages != s.total_pages:
            raise AssertionError(f"KV page leak: {s}")
        self.pins.check()  # every pin on the cache is one of the table's, and within the budget
        self.tiers.check()
        self.prefix.check()  # the cache's own accounting: node states' bytes and budget
        self.states.check(self.live)
        return s


def make_shadows(
    policies: Sequence[str],
    num_pages: int,
    page_size: int,
    chunk_size: int,
    session_ttl: float = 300.0,
    pinned_fraction: float = 0.5,
) -> Shadows | NoShadows:
    """Eviction shadows of ``policies`` for a pool of ``num_pages`` (each a plain ``CacheManager`` under
    its policy; ``runtime/cache/shadows.py``), or the null object when there are none."""
    if not policies:
        return NoShadows()
    pools = {
        p: CacheManager(num_pages, page_size, POLICY_KIND, p, session_ttl, pinned_fraction) for p in policies
    }
    return Shadows(pools, chunk_size)
