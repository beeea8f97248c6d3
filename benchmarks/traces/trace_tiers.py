"""Host tier sized by a production-shaped trace: hit rate against tier size with the pool fixed.

Run from the repository root: ``python -m kvreuse.benchmarks.traces.trace_tiers [--quick] [--trace PATH]``.

The Mooncake-format trace (``benchmarks/traces/mooncake.py``) replays token level through the real
scheduler, cache manager and ``TieredRadixCache`` with a real ``HostStore`` below the pool
(evictions demote pages into it, matches load them back; ``benchmarks/traces/belady.py``'s replay).  No
model runs: pages are copied through a page IO of one byte per token slot, so the host budget is
set in pages.  The pool stays at a fixed share of the working set while the host tier grows; the
figure is the token hit rate (pool + host) against the infinite-cache bound, and the tier size that
recovers 90% of it.  Restore traffic: the pages loaded back from the tier, in bytes of the embedded
model's KV (``kv_bytes_per_token`` and the measured restore rate come from
``results/kv_tiers.json``), per second of the trace's own arrival clock and per prompt token.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from kvreuse.benchmarks.common import RESULTS_DIR, base_parser, bench_main, format_table, progress, shown_path
from kvreuse.benchmarks.traces import mooncake
from kvreuse.benchmarks.traces.belady import belady, replay, working_set_pages
from kvreuse.benchmarks.traces.trace_replay import hit_rate, pool_for
from kvreuse.runtime.cache.eviction import DEFAULT_POLICY
from kvreuse.runtime.cache.manager import CacheManager
from kvreuse.runtime.cache.store.host import HostStore
from kvreuse.runtime.cache.store.tiers import LowerTiers

TIER_SHARES = (0.0, 0.1, 0.2, 0.4, 0.7, 1.0)
RECOVER = 0.9


class ByteIO:
    """Page IO for a replay without a model: one uint8 per token slot, so a page costs ``page_size`` bytes."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size

    def read_pages(self, pages: Sequence[int]) -> torch.Tensor:
        return torch.zeros(len(pages), 1, 1, self.page_size, 1, 1, dtype=torch.uint8)

    def write_pages(self, pages: Sequence[int], kv: torch.Tensor) -> None:
        assert kv.shape[0] == len(pages)


def tiered_run(trace, pool: int, page: int, host_pages: int, policy: str) -> tuple[float, int]:
    """Hit rate with a host tier of ``host_pages`` below a pool of ``pool`` pages; pages loaded back."""
    tiers = LowerTiers(HostStore(host_pages * page), None) if host_pages else None
    cache = CacheManager(pool, page, "radix", policy, tiers=tiers, io=ByteIO(page) if tiers else None)
    rate = hit_rate(trace, replay(trace, pool, page, policy, check=False, cache=cache))
    loaded = cache.tier_stats().loaded_host_pages if tiers else 0
    cache.close()
    return rate, loaded


def crossing(points: list[tuple[float, float]], target: float) -> float | None:
    """The smallest tier share at which the (linearly interpolated) hit rate reaches ``target``."""
    for (s0, r0), (s1, r1) in zip(points, points[1:]):
        if r0 >= target:
            return s0
        if r1 >= target:
            return s0 + (s1 - s0) * (target - r0) / (r1 - r0)
    return points[-1][0] if points and points[-1][1] >= target else None


def kv_tier_figures(path: Path = RESULTS_DIR / "kv_tiers.json") -> tuple[int, float]:
    """(KV bytes per token, restore MB/s) of the embedded model, as the tier benchmark measured them."""
    d = json.loads(path.read_text())
    rates = [r["restored_mb"] / r["restore_s"] for shape in d["restart"].values() for r in shape["rounds"]
             if r.get("restore_s")]  # fmt: skip
    return int(d["args"]["kv_bytes_per_token"]), sum(rates) / len(rates)


def run(args: argparse.Namespace) -> dict:
    reqs = mooncake.load(args.trace, limit=600 if args.quick else None)
    trace = mooncake.materialise(reqs, args.unit)
    page, unit = args.page, args.unit
    ws = working_set_pages(trace, page)
    pool = pool_for(trace, args.pool_share, page, ws)
    infinite = hit_rate(trace, belady(trace, 1 << 62, page))
    opt = hit_rate(trace, belady(trace, pool, page))
    kv_bytes, restore_mb_s = kv_tier_figures()
    seconds = (reqs[-1].timestamp_ms - reqs[0].timestamp_ms) / 1000 or 1.0
    prompt_tokens = sum(r.input_length for r in reqs)
    points, rows = [], []
    for share in TIER_SHARES:
        host = int(share * ws)
        rate, loaded = tiered_run(trace, pool, page, host, args.policy)
        restored = loaded * page * unit * kv_bytes  # trace tokens' worth of the embedded model's KV
        points.append((share, rate))
        row = {"host_share": share, "host_pages": host, "hit_rate": rate, "x_infinite": rate / infinite,
               "loaded_pages": loaded, "restore_gb": restored / 1e9, "restore_gb_per_s_of_trace": restored / 1e9 / seconds,
               "restore_bytes_per_prompt_token": restored / prompt_tokens,
               "restore_s_at_measured_rate": restored / (restore_mb_s * 1e6)}  # fmt: skip
        rows.append(row)
        progress(f"host {share:.0%} of the working set: {rate:.3f} ({rate / infinite:.2f} x infinite)")
    need = crossing(points, RECOVER * infinite)
    print(format_table(["host tier (share of working set)", "hit rate", "x infinite", "restore GB/s of trace",
                        "restore B / prompt token"],
                       [[r["host_share"], r["hit_rate"], r["x_infinite"], r["restore_gb_per_s_of_trace"],
                         r["restore_bytes_per_prompt_token"]] for r in rows]))  # fmt: skip
    print(f"infinite {infinite:.3f}, pool only (Belady) {opt:.3f}; {RECOVER:.0%} of infinite from a host tier of "
          f"{need if need is None else f'{need:.0%}'} of the working set")  # fmt: skip
    return {"dtype": "none (token level, no model; bytes priced at the embedded model's fp32 KV)", "threads": 1,
            "trace": shown_path(args.trace), "unit": unit, "page_trace_tokens": page * unit, "policy": args.policy,
            "working_set_pages": ws, "pool_share": args.pool_share, "pool_pages": pool, "infinite": infinite,
            "pool_belady": opt, "kv_bytes_per_token": kv_bytes, "restore_mb_s_measured": restore_mb_s,
            "trace_seconds": seconds, "curve": rows, "recover": RECOVER,
            "host_share_for_recover": need}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("trace_tiers", __doc__.split("\n")[0])
    p.add_argument("--trace", type=Path, default=mooncake.DEFAULT_TRACE, help="Mooncake-format .jsonl")
    p.add_argument("--unit", type=int, default=16, help="trace tokens per replayed token (default 16)")
    p.add_argument(
        "--page", type=int, default=4, help="page size in replayed tokens (default 4: 64 trace tokens)"
    )
    p.add_argument(
        "--pool-share", type=float, default=0.03, help="pool, share of the working set (default 3%%)"
    )
    p.add_argument("--policy", default=DEFAULT_POLICY)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return bench_main("trace_tiers", parse_args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
