"""What the prefix cache holds, for ``GET /v1/cache`` and ``/metrics``: counts and pins, no token content."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvreuse.runtime.cache.shadows import ShadowStats


class CacheSnapshot(NamedTuple):
    """The pool and the pins at one moment (taken on the engine thread)."""

    pages: dict[str, int]
    page_size: int
    policy: str
    pins: list[tuple[Any, int, float]]  # owner, pinned tokens, TTL left
    lapses: dict[str, int]
    lapses_by_tenant: dict[Any, dict[str, int]]
    shadows: ShadowStats | None = None  # --eviction-shadows: other policies' hits on the same requests
    predictor: dict | None = None  # a learned eviction order's kept-vs-evicted return rates (``predict``)


def cache_snapshot(engine) -> CacheSnapshot | None:
    if not engine.cache.caches_prefixes:
        return None
    s = engine.cache.stats(expire_pins=True)
    pages = {
        "total": s.total_pages, "free": s.free_pages, "tree": s.tree_pages, "pinned": s.pinned_pages,
        "evictable": s.evictable_pages, "in_use": s.request_pages, "evicted_total": s.evicted_pages,
    }  # fmt: skip
    live, lapsed, by_tenant = engine.cache.pin_report()
    pins = [(p.owner, p.tokens, p.ttl_left) for p in live]
    shadows = engine.cache.shadow_stats()
    predictor = engine.cache.predictor_stats()
    return CacheSnapshot(
        pages, engine.cache.page_size, engine.config.eviction_policy, pins, lapsed, by_tenant, shadows,
        predictor,
    )  # fmt: skip


def describe(snap: CacheSnapshot | None, tenant: str | None, own_only: bool = False) -> dict[str, Any]:
    """The JSON of ``GET /v1/cache`` for ``tenant``.  ``own_only`` (API keys on, not the operator):
    no figure that moves with other tenants' traffic (tree, free or evicted pages, their lapses),
    only the pool's size and the caller's own pins, pinned pages and lapses (issue 39)."""
    if snap is None:
        return {"object": "cache", "prefix_cache": "off"}
    sessions, prewarmed, own_tokens = [], [], 0
    for owner, tokens, ttl_left in snap.pins:
        if not isinstance(owner, tuple) or owner[0] != tenant:
            continue
        own_tokens += tokens
        entry = {"id": owner[-1], "pinned_tokens": tokens, "ttl_left_s": round(ttl_left, 3)}
        (prewarmed if owner[1:2] == ("prewarm",) else sessions).append(entry)
    pages, evictions = snap.pages, {"evicted_pages": snap.pages["evicted_total"], "pin_lapses": snap.lapses}
    if own_only:  # pinned pages of its own pins (a prefix two of them share counts twice)
        pages = {"total": snap.pages["total"], "pinned": own_tokens // snap.page_size}
        evictions = {"pin_lapses": snap.lapses_by_tenant.get(tenant, {})}
    out = {
        "object": "cache", "page_size": snap.page_size, "eviction_policy": snap.policy, "pages": pages,
        "sessions": sessions, "prewarmed": prewarmed, "evictions": evictions,
    }  # fmt: skip
    if snap.shadows is not None and not own_only:  # every tenant's traffic: the operator's figure
        sh = snap.shadows
        rate = lambda n: round(n / sh.prompt_tokens, 4) if sh.prompt_tokens else 0.0  # noqa: E731
        out["eviction_shadows"] = {
            "prompt_tokens": sh.prompt_tokens,
            "served": {
                "policy": snap.policy,
                "cached_tokens": sh.served_tokens,
                "hit_rate": rate(sh.served_tokens),
            },
            "policies": {p: {"cached_tokens": n, "hit_rate": rate(n)} for p, n in sh.cached_tokens.items()},
        }
    if snap.predictor is not None and not own_only:  # learned from every tenant's traffic: the operator's
        out["eviction_predictor"] = snap.predictor
    return out


class CacheCollector(Collector):
    """Pinned pages, live pins and pin lapses by cause, from the last snapshot."""

    def __init__(self, snapshot: Callable[[], CacheSnapshot | None]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator:
        snap = self._snapshot()
        if snap is None:
            return
        yield GaugeMetricFamily(
            "kvreuse_kv_pages_pinned", "KV pages pinned (sessions, prewarm)", value=snap.pages["pinned"]
        )
        yield GaugeMetricFamily(
            "kvreuse_kv_pages_evictable", "Tree pages no request or pin holds", value=snap.pages["evictable"]
        )
        yield GaugeMetricFamily(
            "kvreuse_pins", "Live pins (sessions and prewarmed prefixes)", value=len(snap.pins)
        )
        lapses = CounterMetricFamily("kvreuse_pin_lapses", "Pins that lapsed, by cause", labels=["cause"])
        for cause in ("ttl", "budget", "pressure", "moved"):
            lapses.add_metric([cause], snap.lapses.get(cause, 0))
        yield lapses
