"""What ``kvreuse top`` shows: one server sample (its ``/metrics`` and ``/v1/cache``) as rich panels,
with rates from the previous sample."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Group
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

Labels = frozenset[tuple[str, str]]


@dataclass
class Sample:
    """One poll of a server: every Prometheus sample by (name, labels), the caller's ``/v1/cache``."""

    at: float
    metrics: dict[tuple[str, Labels], float]
    cache: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, at: float, metrics_text: str, cache: dict[str, Any]) -> Sample:
        values = {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(metrics_text)
            for s in family.samples
        }
        return cls(at, values, cache)

    def get(self, name: str, **labels: str) -> float:
        return self.metrics.get((name, frozenset(labels.items())), 0.0)

    def by_label(self, name: str, label: str) -> dict[str, float]:
        return {dict(k)[label]: v for (n, k), v in self.metrics.items() if n == name and label in dict(k)}

    def quantile(self, name: str, q: float) -> float | None:
        """The upper bound of the histogram bucket holding quantile ``q`` (None: no observations)."""
        buckets = sorted((float(le), v) for le, v in self.by_label(f"{name}_bucket", "le").items())
        total = buckets[-1][1] if buckets else 0
        if not total:
            return None
        return next(le for le, count in buckets if count >= q * total)


def _n(v: float) -> str:
    return f"{int(v):,}"


def _rate(now: Sample, before: Sample | None, name: str) -> str:
    if before is None or now.at <= before.at:
        return "–"
    return f"{(now.get(name) - before.get(name)) / (now.at - before.at):,.1f}/s"


def _secs(v: float | None) -> str:
    return "–" if v is None else ("+Inf" if v == float("inf") else f"≤ {v:g} s")


def _bar(used: float, total: float) -> ProgressBar:
    return ProgressBar(total=max(total, 1), completed=used, width=30)


def traffic(now: Sample, before: Sample | None) -> Panel:
    prompt, cached = now.get("kvreuse_prompt_tokens_total"), now.get("kvreuse_cached_tokens_total")
    t = Table.grid(padding=(0, 2))
    t.add_column(style="dim")
    t.add_column(justify="right")
    t.add_column(justify="right", style="cyan")
    t.add_row("requests", _n(now.get("kvreuse_requests_total")), _rate(now, before, "kvreuse_requests_total"))
    t.add_row("prompt tokens", _n(prompt), _rate(now, before, "kvreuse_prompt_tokens_total"))
    t.add_row("  cached", _n(cached), _rate(now, before, "kvreuse_cached_tokens_total"))
    t.add_row("  prefilled", _n(now.get("kvreuse_prefilled_tokens_total")),
              _rate(now, before, "kvreuse_prefilled_tokens_total"))  # fmt: skip
    t.add_row("generated tokens", _n(now.get("kvreuse_generated_tokens_total")),
              _rate(now, before, "kvreuse_generated_tokens_total"))  # fmt: skip
    t.add_row("hit rate", f"{cached / prompt:.1%}" if prompt else "–", "")
    ttft = "kvreuse_time_to_first_token_seconds"
    t.add_row("TTFT p50 / p95", f"{_secs(now.quantile(ttft, 0.5))} / {_secs(now.quantile(ttft, 0.95))}", "")
    t.add_row("running / waiting", f"{_n(now.get('kvreuse_running_requests'))} / "
              f"{_n(now.get('kvreuse_waiting_requests'))}", "")  # fmt: skip
    t.add_row("refused (503)", _n(now.get("kvreuse_rejected_requests_total")), "")
    return Panel(t, title="traffic", border_style="blue")


def tiers(now: Sample) -> Panel:
    total, used = now.get("kvreuse_kv_pages_total"), now.get("kvreuse_kv_pages_used")
    t = Table.grid(padding=(0, 2))
    t.add_column(style="dim")
    t.add_column()
    t.add_column(justify="right")
    t.add_row("pool", _bar(used, total), f"{_n(used)} / {_n(total)} pages")
    t.add_row("  tree", "", f"{_n(now.get('kvreuse_radix_tree_pages'))} pages")
    t.add_row("  pinned", "", f"{_n(now.get('kvreuse_kv_pages_pinned'))} pages")
    t.add_row("  evictable", "", f"{_n(now.get('kvreuse_kv_pages_evictable'))} pages")
    pages = now.by_label("kvreuse_kv_tier_pages", "tier")
    t.add_row("host tier", "", f"{_n(pages.get('host', 0))} pages")
    t.add_row("disk tier", "", f"{_n(pages.get('disk', 0))} pages, "
              f"{now.get('kvreuse_kv_disk_tier_bytes') / 2**20:,.1f} MiB")  # fmt: skip
    by_tier = now.by_label("kvreuse_cached_tokens_by_tier_total", "tier")
    t.add_row("cached from", "", "  ".join(f"{k} {_n(v)}" for k, v in by_tier.items()))
    t.add_row("evicted", "", f"{_n(now.get('kvreuse_evicted_pages_total'))} pages")
    shadow_prompt = now.get("kvreuse_eviction_shadow_prompt_tokens_total")
    if shadow_prompt:  # --eviction-shadows: other policies' hit rates on the same requests
        rates = {"served": now.get("kvreuse_eviction_shadow_served_tokens_total")}
        rates |= now.by_label("kvreuse_eviction_shadow_cached_tokens_total", "policy")
        t.add_row("shadows", "", "  ".join(f"{k} {v / shadow_prompt:.1%}" for k, v in rates.items()))
    return Panel(t, title="KV tiers", border_style="green")


def causes(now: Sample) -> Panel:
    t = Table("cause", "requests", box=None, header_style="dim")
    for cause, n in sorted(
        now.by_label("kvreuse_cache_diagnosis_total", "cause").items(), key=lambda x: -x[1]
    ):
        t.add_row(Text(cause, style="green" if cause == "append_only" else "red"), _n(n))
    return Panel(t, title="cache diagnosis (chat)", border_style="magenta")


def pins(now: Sample) -> Panel:
    c = now.cache
    if c.get("prefix_cache") == "off":
        return Panel("prefix cache off", title="sessions and pins")
    t = Table("kind", "id", "pinned tokens", "TTL left", box=None, header_style="dim")
    for kind in ("sessions", "prewarmed"):
        for p in c.get(kind, []):
            t.add_row(kind.rstrip("s"), str(p["id"]), _n(p["pinned_tokens"]), f"{p['ttl_left_s']:.0f} s")
    lapses = c.get("evictions", {}).get("pin_lapses", {})
    foot = Text("pin lapses: " + ", ".join(f"{k} {v}" for k, v in lapses.items()), style="dim")
    return Panel(Group(t, foot), title="sessions and pins (this key's)", border_style="yellow")


def render(url: str, now: Sample, before: Sample | None) -> Group:
    head = Text.assemble(("kvreuse top ", "bold"), (url, "cyan"), ("  (Ctrl-C quits)", "dim"))
    grid = Table.grid(expand=True, padding=(0, 1))
    grid.add_column(ratio=1)
    grid.add_column(ratio=1)
    grid.add_row(traffic(now, before), tiers(now))
    grid.add_row(causes(now), pins(now))
    return Group(head, grid)
