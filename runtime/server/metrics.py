"""Prometheus metrics: engine totals and pool gauges read at scrape time, per-request histograms."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvreuse.runtime.engine.engine import EngineStats

_COUNTERS = (
    ("requests", "requests", "Requests the engine accepted"),
    ("prompt_tokens", "prompt_tokens", "Prompt tokens of accepted requests"),
    ("cached_tokens", "cached_tokens", "Prompt tokens served from the prefix cache"),
    ("prefilled_tokens", "prefilled_tokens", "Prompt tokens computed (not cached)"),
    ("generated_tokens", "generated_tokens", "Tokens generated"),
    ("evicted_pages", "evicted_pages", "KV pages evicted from the prefix cache"),
    ("drafted_tokens", "speculative_drafted_tokens", "Tokens drafted by speculative decoding and verified"),
    ("accepted_tokens", "speculative_accepted_tokens", "Drafted tokens accepted (emitted without a step)"),
)


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], EngineStats | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator:
        s = self._stats()
        if s is None:
            return
        for field, name, doc in _COUNTERS:
            yield CounterMetricFamily(f"kvreuse_{name}", doc, value=getattr(s, field))
        gauges = (
            ("running_requests", s.running, "Requests being decoded or prefilled"),
            ("waiting_requests", s.waiting, "Requests queued in the engine"),
            ("kv_pages_used", s.total_pages - s.free_pages, "KV pages in use (tree + requests)"),
            ("kv_pages_free", s.free_pages, "KV pages on the free list"),
            ("kv_pages_total", s.total_pages, "KV pages in the pool"),
            ("radix_tree_pages", s.tree_pages, "KV pages held by the prefix cache tree"),
        )
        for name, value, doc in gauges:
            yield GaugeMetricFamily(f"kvreuse_{name}", doc, value=value)
        yield from _tier_families(s)
        yield from _shadow_families(s)


def _shadow_families(s: EngineStats) -> Iterator:
    """``--eviction-shadows``: over the finished requests they replayed, the prompt tokens, what the pool
    served of them and what each shadow policy would have (``runtime/cache/shadows.py``)."""
    if s.shadows is None:
        return
    yield CounterMetricFamily(
        "kvreuse_eviction_shadow_prompt_tokens", "Prompt tokens of the finished requests the shadows replayed",
        value=s.shadows.prompt_tokens,
    )  # fmt: skip
    yield CounterMetricFamily(
        "kvreuse_eviction_shadow_served_tokens", "Of those, the tokens the pool served from its cache",
        value=s.shadows.served_tokens,
    )  # fmt: skip
    cached = CounterMetricFamily(
        "kvreuse_eviction_shadow_cached_tokens", "Of those, the tokens each shadow policy would have served",
        labels=["policy"],
    )  # fmt: skip
    for policy, value in s.shadows.cached_tokens.items():
        cached.add_metric([policy], value)
    yield cached


def _tier_families(s: EngineStats) -> Iterator:
    """Where cached tokens came from (pool / host tier / disk tier), the time loading them, and the
    lower tiers' size; the three tiers' counters add up to ``kvreuse_cached_tokens``."""
    by_tier = CounterMetricFamily(
        "kvreuse_cached_tokens_by_tier", "Prompt tokens served from the cache, by the tier they were in",
        labels=["tier"],
    )  # fmt: skip
    shared = s.shared_loaded_tokens
    pool = s.cached_tokens - s.host_loaded_tokens - s.disk_loaded_tokens - shared
    for tier, value in (
        ("pool", pool),
        ("host", s.host_loaded_tokens),
        ("disk", s.disk_loaded_tokens),
        ("shared", shared),
    ):
        by_tier.add_metric([tier], value)
    yield by_tier
    yield CounterMetricFamily(
        "kvreuse_kv_tier_load_seconds", "Engine-thread time loading cached pages from the host/disk tiers",
        value=s.tier_load_s,
    )  # fmt: skip
    yield CounterMetricFamily(
        "kvreuse_kv_tier_read_ahead_seconds", "Background disk reads of cached pages (read-ahead)",
        value=s.tier_read_ahead_s,
    )  # fmt: skip
    pages = GaugeMetricFamily("kvreuse_kv_tier_pages", "KV pages held by each lower tier", labels=["tier"])
    pages.add_metric(["host"], s.host_tier_pages)
    pages.add_metric(["disk"], s.disk_tier_pages)
    yield pages
    yield GaugeMetricFamily("kvreuse_kv_disk_tier_bytes", "Bytes of the disk tier's page files",
                            value=s.disk_tier_bytes)  # fmt: skip
    yield CounterMetricFamily(
        "kvreuse_kv_store_write_failures", "Disk-tier writes that failed (the first makes the tier read-only)",
        value=s.store_write_failures,
    )  # fmt: skip
    yield GaugeMetricFamily(
        "kvreuse_kv_store_degraded", "1 when the disk tier takes no more writes (the server runs pool-only)",
        value=int(s.store_error is not None),
    )  # fmt: skip
    yield CounterMetricFamily(
        "kvreuse_kv_shared_written_pages", "KV pages this replica wrote to the shared tier",
        value=s.shared_written_pages,
    )  # fmt: skip
    yield CounterMetricFamily(
        "kvreuse_kv_shared_failures", "Shared-store calls that failed (each turns the tier off for a while)",
        value=s.shared_failures,
    )  # fmt: skip
    yield GaugeMetricFamily(
        "kvreuse_kv_shared_degraded", "1 while the shared KV store is unreachable (the replica runs on its pool)",
        value=int(s.shared_error is not None),
    )  # fmt: skip


class ServerMetrics:
    """One registry per server (no process-global state), so tests can run several apps."""

    def __init__(self, stats: Callable[[], EngineStats | None]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(stats))
        r = self.registry
        self.http_requests = Counter(
            "kvreuse_http_requests",
            "HTTP API requests by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "kvreuse_time_to_first_token_seconds",
            "Time from arrival to first token",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.itl = Histogram(
            "kvreuse_inter_token_latency_seconds",
            "Mean time between tokens of a request",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.hit_ratio = Histogram(
            "kvreuse_request_cache_hit_ratio",
            "Cached prompt tokens / prompt tokens, per request",
            buckets=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0),
            registry=r,
        )
        self.cache_miss = Counter(
            "kvreuse_cache_diagnosis",
            "Chat requests by diagnosed cache outcome (see diagnostics.CAUSES)",
            ["cause"],
            registry=r,
        )
        self.rejected = Counter(
            "kvreuse_rejected_requests", "Requests refused with 503 (queue full or draining)", registry=r
        )

    def observe_request(
        self,
        prompt_tokens: int,
        cached_tokens: int,
        output_tokens: int,
        ttft: float | None,
        decode: float | None,
    ) -> None:
        if ttft is not None:
            self.ttft.observe(ttft)
        if decode is not None and output_tokens > 1:
            self.itl.observe(decode / (output_tokens - 1))
        if prompt_tokens:
            self.hit_ratio.observe(cached_tokens / prompt_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
