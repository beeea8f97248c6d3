"""The engine's figures in one record: request and token totals, the pool, the lower KV tiers and
a hybrid model's state snapshots (``Engine.stats``; the server's metrics and ``/v1/cache`` read it)."""

from __future__ import annotations

from typing import NamedTuple

from kvreuse.runtime.cache.manager import CacheManager
from kvreuse.runtime.cache.shadows import ShadowStats
from kvreuse.runtime.scheduler import Scheduler


class EngineStats(NamedTuple):
    """Totals since start (counters) and the pool right now (gauges)."""

    requests: int
    prompt_tokens: int
    cached_tokens: int
    prefilled_tokens: int
    generated_tokens: int
    evicted_pages: int
    retractions: int
    running: int
    waiting: int
    total_pages: int
    free_pages: int
    tree_pages: int
    request_pages: int
    page_size: int
    host_loaded_tokens: int = 0  # of cached_tokens: loaded back from the host tier
    disk_loaded_tokens: int = 0  # of cached_tokens: loaded back from the disk tier
    shared_loaded_tokens: int = 0  # of cached_tokens: from the shared tier (pages any replica wrote)
    tier_load_s: float = 0.0  # time spent loading them (the engine thread's part)
    tier_read_ahead_s: float = 0.0  # background disk reads of them, overlapping other requests' compute
    host_tier_pages: int = 0
    disk_tier_pages: int = 0
    disk_tier_bytes: int = 0
    store_write_failures: int = 0  # disk-tier writes that failed (the first one makes it read-only)
    store_error: str | None = None  # why the disk tier takes no more writes (pool-only), or None
    shared_written_pages: int = 0  # pages this replica wrote to the shared tier
    shared_failures: int = 0  # shared-store calls that failed
    shared_error: str | None = None  # why the shared tier is not used now (store unreachable), or None
    snapshots: int = 0  # hybrids: linear-attention state snapshots held now, their bytes, and
    snapshot_bytes: int = 0  # KV-matched tokens of finished requests recomputed for want of a snapshot
    snapshot_cut_tokens: int = 0
    drafted_tokens: int = 0  # speculative decoding: tokens drafted and verified, and of those accepted
    accepted_tokens: int = 0
    shadows: ShadowStats | None = None  # other policies' hits on the same requests (--eviction-shadows)


def engine_stats(
    cache: CacheManager, scheduler: Scheduler, requests: int, prompt_tokens: int, snapshot_cut: int
) -> EngineStats:
    """Read the figures off the cache manager and the scheduler (on the engine's thread)."""
    cs, st = cache.stats(), scheduler.totals
    return EngineStats(
        requests=requests, prompt_tokens=prompt_tokens, cached_tokens=st.cached,
        prefilled_tokens=st.prefilled, generated_tokens=st.generated, evicted_pages=cs.evicted_pages,
        retractions=scheduler.num_retractions, running=len(scheduler.running),
        waiting=len(scheduler.waiting), total_pages=cs.total_pages, free_pages=cs.free_pages,
        tree_pages=cs.tree_pages, request_pages=cs.request_pages, page_size=cache.page_size,
        drafted_tokens=st.drafted, accepted_tokens=st.accepted, shadows=cache.shadow_stats(),
        **_tier_fields(cache), snapshots=cs.snapshots, snapshot_bytes=cs.snapshot_bytes,
        snapshot_cut_tokens=snapshot_cut,  # hybrids' snapshots live on the prefix cache's nodes (0: dense)
        # the requests' own splits, not the tiers' page loads: the same totals as the responses' figures
        host_loaded_tokens=st.cached_host, disk_loaded_tokens=st.cached_disk, shared_loaded_tokens=st.cached_shared,
    )  # fmt: skip


def _tier_fields(cache: CacheManager) -> dict:
    ts = cache.tier_stats()
    if ts is None:
        return {}
    return dict(
        tier_load_s=ts.load_seconds, tier_read_ahead_s=ts.read_ahead_seconds, host_tier_pages=ts.host_pages, disk_tier_pages=ts.disk_pages,
        disk_tier_bytes=ts.disk_bytes, store_write_failures=ts.write_failures, store_error=ts.disk_error,
        shared_written_pages=ts.shared_written_pages,
        shared_failures=ts.shared_failures, shared_error=ts.shared_error,
    )  # fmt: skip
