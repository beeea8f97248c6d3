"""Pins: named, expiring locks on radix-tree nodes within a page budget.

A pin keeps a prefix (a node and all its ancestors) out of eviction for ``ttl`` seconds after it
was last set or used.  Its owner is any hashable key: a session (``("session", tenant, id)``:
the session's last node, prompt + output, re-pinned at the end of each of its requests) or an
explicit cache breakpoint (``("breakpoint", tenant, ...)``, e.g. a prewarmed prefix or an
Anthropic ``cache_control`` mark, with its own TTL).  One owner holds one pin; pinning again
moves it.

Pinned pages are the union of the pinned paths (a shared prefix counts once), kept by the cache
(``PrefixCache.stats().pinned_pages``; the naive baseline pins nothing).  They never exceed ``budget`` pages: over it, the pins used
longest ago lapse first, so pins cannot starve admission; when the pool is short even after
evicting everything unpinned, the cache manager lapses pins the same way.  Lapses are counted
by cause (``ttl``, ``budget``, ``pressure``, ``moved``: the owner pinned another node).

Tenants: an owner tuple's first item is its tenant (sessions, prewarms, stored responses and
``cache_control`` breakpoints all carry it).  Each tenant holding pins has an equal share of the
budget (``share``).  Over the budget, pins lapse from the tenant most over its share, oldest first, so
a tenant flooding sessions, prewarms, stored responses or long-TTL breakpoints pushes out its own
pins, never those of a tenant within its share.  Under pool pressure (``lapse_for``) the same order,
then the requester's own pins; another tenant's pin within its share lapses only when nothing else
will free pages (no other request holds any), so pins never starve admission for good.  No tenant
holds more than ``per_tenant`` pins (its own oldest lapses).  Lapses are counted per tenant too, so
each tenant sees only its own.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import NamedTuple

from kvreuse.runtime.cache.prefix_cache import PrefixCache


@dataclass
class Pin:
    """One owner's pin: the node it holds and until when."""

    handle: object
    ttl: float
    expires: float
    tokens: int  # prefix length the pin covers
    tenant: Hashable = None


class PinInfo(NamedTuple):
    """What introspection shows of a pin (no token content)."""

    owner: Hashable
    tokens: int
    ttl_left: float


def tenant_of(owner: Hashable) -> Hashable:
    """The tenant a pin's owner belongs to: the first item of an owner tuple (None otherwise)."""
    return owner[0] if isinstance(owner, tuple) and len(owner) > 1 else None


class PinTable:
    """The pins of one prefix cache, oldest-used first (see the module docstring)."""

    def __init__(
        self,
        cache: PrefixCache,
        budget_pages: int,
        ttl: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        per_tenant: int = 64,
    ) -> None:
        if ttl <= 0:
            raise ValueError(f"pin ttl must be > 0 seconds, got {ttl}")
        self.cache, self.budget, self.ttl, self.clock = cache, budget_pages, ttl, clock
        self.per_tenant = per_tenant
        self._pins: OrderedDict[Hashable, Pin] = OrderedDict()
        self.lapsed: Counter[str] = Counter()
        self.lapsed_by: defaultdict[Hashable, Counter[str]] = defaultdict(Counter)  # tenant -> cause -> n

    def __len__(self) -> int:
        return len(self._pins)

    def __contains__(self, owner: Hashable) -> bool:
        return owner in self._pins

    def pin(self, owner: Hashable, handle: object, ttl: float | None = None) -> bool:
        """Pin ``handle`` for ``owner`` (moving its earlier pin); returns whether the pin survived the budget.

        An empty prefix (the cache holds nothing for it) is not pinned.
        """
        self.expire()
        ttl = self.ttl if ttl is None else ttl
        if ttl <= 0:
            raise ValueError(f"pin ttl must be > 0 seconds, got {ttl}")
        tokens = self.cache.handle_len(handle)
        if tokens == 0:
            return False
        self.cache.pin(handle)  # before dropping the old pin, so a shared prefix never flips
        old = self._pins.pop(owner, None)
        if old is not None:
            self.cache.unpin(old.handle)
            if old.handle is not handle:
                self._count(old.tenant, "moved")
        tenant = tenant_of(owner)
        self._pins[owner] = Pin(handle, ttl, self.clock() + ttl, tokens, tenant)
        own = [o for o, p in self._pins.items() if p.tenant == tenant]
        for o in own[: max(0, len(own) - self.per_tenant)]:  # over its count: its own oldest go
            self._lapse(o, "budget")
        while self.cache.stats().pinned_pages > self.budget and self._pins:
            if not self.lapse_over_share("budget"):
                self.lapse_oldest("budget")
        return owner in self._pins

    def touch(self, owner: Hashable) -> None:
        """A use of the owner's prefix: its TTL starts again and it becomes the newest pin."""
        pin = self._pins.get(owner)
        if pin is not None:
            pin.expires = self.clock() + pin.ttl
            self._pins.move_to_end(owner)

    def unpin(self, owner: Hashable) -> None:
        pin = self._pins.pop(owner, None)
        if pin is not None:
            self.cache.unpin(pin.handle)

    def expire(self) -> int:
        """Lapse every pin past its TTL; returns how many."""
        now = self.clock()
        dead = [owner for owner, pin in self._pins.items() if pin.expires <= now]
        for owner in dead:
            self._lapse(owner, "ttl")
        return len(dead)

    def held(self) -> Counter[Hashable]:
        """Pinned tokens per tenant (a prefix shared by two of its pins counts twice: against it)."""
        held: Counter[Hashable] = Counter()
        for p in self._pins.values():
            held[p.tenant] += p.tokens
        return held

    def share(self, tenants: int) -> float:
        """Each of ``tenants`` tenants' share of the budget, in tokens."""
        return self.budget * self.cache.page_size / max(1, tenants)

    def lapse_over_share(self, cause: str) -> bool:
        """Lapse the oldest pin of the tenant most over its share; False when none is over it."""
        held = self.held()
        share = self.share(len(held))
        over = {t: n - share for t, n in held.items() if n > share}
        if not over:
            return False
        worst = max(over, key=over.__getitem__)
        self._lapse(next(o for o, p in self._pins.items() if p.tenant == worst), cause)
        return True

    def lapse_for(self, tenant: Hashable, others_hold_pages: bool, cause: str = "pressure") -> bool:
        """Lapse one pin so that ``tenant``'s request gets pages: one over its share, else one of
        ``tenant``'s own, else (only when no other request holds pages to give back) the oldest of the
        tenant holding most; False when none may lapse (the request waits)."""
        if self.lapse_over_share(cause):
            return True
        own = next((o for o, p in self._pins.items() if p.tenant == tenant), None)
        if own is not None:
            self._lapse(own, cause)
            return True
        if others_hold_pages or not self._pins:
            return False
        self.lapse_oldest(cause)
        return True

    def lapse_oldest(self, cause: str) -> None:
        """Lapse the oldest-used pin of the tenant holding the most pinned tokens."""
        held = self.held()
        top = max(held.values())
        owner = next(o for o, p in self._pins.items() if held[p.tenant] == top)
        self._lapse(owner, cause)

    def _lapse(self, owner: Hashable, cause: str) -> None:
        pin = self._pins[owner]
        self.unpin(owner)
        self._count(pin.tenant, cause)

    def _count(self, tenant: Hashable, cause: str) -> None:
        self.lapsed[cause] += 1
        self.lapsed_by[tenant][cause] += 1

    def clear(self) -> None:
        while self._pins:
            self.unpin(next(iter(self._pins)))

    def info(self) -> list[PinInfo]:
        now = self.clock()
        return [PinInfo(o, p.tokens, max(0.0, p.expires - now)) for o, p in self._pins.items()]

    def check(self) -> int:
        """The cache's pins are exactly this table's, within the budget; returns the pinned pages."""
        s = self.cache.stats()
        if s.pins != len(self._pins):
            raise AssertionError(
                f"pinned pages: the cache holds {s.pins} pins, the pin table {len(self._pins)}"
            )
        if s.pinned_pages > min(self.budget, s.cached_pages):
            raise AssertionError(f"{s.pinned_pages} pinned pages over the budget {self.budget} or the cache")
        return s.pinned_pages
