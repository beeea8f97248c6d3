"""Eviction policies on a production-shaped trace (Mooncake format), against LRU, Belady and an infinite cache.

Run from the repository root: ``python -m kvreuse.benchmarks.traces.trace_replay [--quick] [--trace PATH]``.

The trace (``benchmarks/traces/mooncake.py``; kept out of the repository, read from
``../shared/traces/`` at run time) replays token level through the real scheduler, cache manager
and radix tree (``benchmarks/traces/belady.py``: nothing computed, the same accounting as the engine), at
pools of 3%, 10% and 30% of the trace's working set (the distinct pages it leaves behind) and at
two page sizes.  Three traces: the whole trace and its two halves by time.  The overfitting
guard: the default policy's design and its one knob were chosen on the *first* half only; the
second half and the whole trace are held out (``proven``'s variant too, with the agent traces;
it has no knob of its own; ``answer``'s two were chosen on the first half and a synthetic
trace).  ``before`` is the previous default (``reuse``), ``after`` the
current one.  The figure is the token hit rate: cached prompt tokens over prompt
tokens; ``infinite`` is what a pool that never evicts would hit, and ``which_oracle`` what an
eviction hits that knows *which* pages will be used again but not *when* (``belady.which_oracle``):
what Belady gains beyond it is knowing when.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from kvreuse.benchmarks.common import base_parser, bench_main, format_table, progress, shown_path
from kvreuse.benchmarks.traces import mooncake
from kvreuse.benchmarks.traces.belady import Trace, belady, replay, which_oracle, working_set_pages
from kvreuse.runtime.cache.eviction import DEFAULT_POLICY, POLICIES
from kvreuse.runtime.cache.manager import CacheManager

SHARES = (0.03, 0.10, 0.30)
BEFORE = "reuse"  # the default these traces were first replayed against (issue 33)
GOAL_X_BELADY = 0.6


def hit_rate(trace: Trace, cached: list[int]) -> float:
    return sum(cached) / sum(len(p) for p, _ in trace)


def pool_for(trace: Trace, share: float, page: int, ws: int) -> int:
    """``share`` of the working set, never less than the largest request needs (it must fit)."""
    need = max(-(-(len(p) + len(o)) // page) for p, o in trace) + 1
    return max(int(share * ws), need)


def _cell(trace: Trace, pool: int, page: int, policy: str) -> tuple[float, float, dict]:
    """One policy's hit rate at one pool, the seconds it took, and what eviction cost: each eviction
    call and each leaf scored timed (run in a worker process).  A learned policy's figures too."""
    cache = CacheManager(pool, page, "radix", policy)
    prefix, pol, cost = (
        cache.prefix,
        cache.prefix.policy,
        {"evictions": 0, "evict_s": 0.0, "scored": 0, "score_s": 0.0},
    )
    evict, priority = prefix.evict, pol.priority

    def timed_evict(n: int) -> int:
        t = time.perf_counter()
        out = evict(n)
        cost["evictions"] += 1
        cost["evict_s"] += time.perf_counter() - t
        return out

    def timed_priority(node, now: int) -> tuple:
        t = time.perf_counter()
        out = priority(node, now)
        cost["scored"] += 1
        cost["score_s"] += time.perf_counter() - t
        return out

    prefix.evict, pol.priority = timed_evict, timed_priority
    t0 = time.perf_counter()
    rate = hit_rate(trace, replay(trace, pool, page, policy, check=False, cache=cache))
    seconds = time.perf_counter() - t0
    per = {
        "evictions": cost["evictions"],
        "us_per_eviction": 1e6 * cost["evict_s"] / max(cost["evictions"], 1),
        "scored_per_eviction": cost["scored"] / max(cost["evictions"], 1),
        "us_per_score": 1e6 * cost["score_s"] / max(cost["scored"], 1),
    }
    learned = pol.predictor()
    return rate, seconds, {**per, "predictor": learned} if learned is not None else per


def run_trace(trace: Trace, page: int, policies: list[str], shares=SHARES, jobs: int = 1) -> dict:
    """Belady, infinite and every policy at each pool share, for one trace and page size.  ``jobs``:
    worker processes replaying the (pool, policy) cells side by side (each cell is independent)."""
    ws = working_set_pages(trace, page)
    infinite = hit_rate(trace, belady(trace, 1 << 62, page))
    out = {"requests": len(trace), "prompt_tokens": sum(len(p) for p, _ in trace), "working_set_pages": ws,
           "infinite": infinite, "pools": {}}  # fmt: skip
    pools = {share: pool_for(trace, share, page, ws) for share in shares}
    with ProcessPoolExecutor(jobs) as ex:
        cells = {(s, p): ex.submit(_cell, trace, pools[s], page, p) for s in shares for p in policies}
        for share in shares:
            pool = pools[share]
            opt = hit_rate(trace, belady(trace, pool, page))
            which = hit_rate(trace, which_oracle(trace, pool, page))
            rates, seconds, costs = {}, {}, {}
            for policy in policies:
                rates[policy], seconds[policy], costs[policy] = cells[share, policy].result()
                progress(
                    f"  {share:.0%} {policy}: {rates[policy]:.3f} (belady {opt:.3f}, {seconds[policy]:.0f} s)"
                )
            out["pools"][f"{share:.2f}"] = {
                "pool_pages": pool,
                "belady": opt,
                "which_oracle": which,
                "hit_rate": rates,
                "replay_seconds": seconds,
                "eviction_cost": costs,
            }
    return out


def traces(path: Path, quick: bool, which: list[str]) -> dict[str, list[mooncake.TraceRequest]]:
    reqs = mooncake.load(path, limit=600 if quick else None)
    first, second = mooncake.halves(reqs)
    named = {"first": ("first_half (tuning)", first), "second": ("second_half (held out)", second),
             "full": ("full (held out)", reqs)}  # fmt: skip
    return dict(named[w] for w in which)


def verdict(results: dict, policies: list[str]) -> dict:
    """Each policy but LRU against Belady and LRU on every trace, page size and pool."""
    rows = [(name, page, share, r["belady"], {**r["hit_rate"], "which_oracle": r["which_oracle"]})
            for name, by_page in results.items() for page, t in by_page.items()
            for share, r in t["pools"].items()]  # fmt: skip
    out = {}
    for policy in (p for p in [*policies, "which_oracle"] if p != "lru"):
        xb = [(h[policy] / b if b else 1.0, f"{n} page {p} pool {s}") for n, p, s, b, h in rows]
        xl = [(h[policy] / h["lru"] if h["lru"] else 1.0, f"{n} page {p} pool {s}") for n, p, s, b, h in rows]
        out[policy] = {"min_x_belady": min(xb), "min_x_lru": min(xl),
                       "meets_x_belady": min(xb)[0] >= GOAL_X_BELADY, "never_below_lru": min(xl)[0] >= 1.0}  # fmt: skip
    return out


def run(args: argparse.Namespace) -> dict:
    policies = list(POLICIES) if not args.policies else args.policies.split(",")
    for p in ("lru", BEFORE, DEFAULT_POLICY):
        if p not in policies:
            policies.append(p)
    pages = [int(x) for x in args.pages.split(",")]
    results: dict[str, dict] = {}
    table = []
    for name, reqs in traces(args.trace, args.quick, args.traces.split(",")).items():
        trace = mooncake.materialise(reqs, args.unit)
        results[name] = {}
        for page in pages:
            label = f"{page * args.unit}"
            progress(f"{name}, page {label} trace tokens ({len(trace)} requests)")
            r = results[name][label] = run_trace(trace, page, policies, SHARES, args.jobs)
            for share, pr in r["pools"].items():
                table.append([name, label, share, r["infinite"], pr["belady"], pr["which_oracle"],
                              *(pr["hit_rate"][p] for p in policies),
                              pr["hit_rate"][BEFORE] / pr["belady"], pr["hit_rate"][DEFAULT_POLICY] / pr["belady"]])  # fmt: skip
    print(format_table(["trace", "page", "pool", "infinite", "Belady", "which-oracle", *policies,
                        f"{BEFORE} x Bel", f"{DEFAULT_POLICY} x Bel"], table))  # fmt: skip
    v = verdict(results, policies)
    print("verdict:", v)
    return {"dtype": "none (token level, no model)", "threads": 1, "trace": shown_path(args.trace), "unit": args.unit,
            "page_sizes_trace_tokens": [p * args.unit for p in pages], "before": BEFORE, "after": DEFAULT_POLICY,
            "traces": results, "verdict": v, "goal": {"x_belady": GOAL_X_BELADY, "x_lru": 1.0}}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("trace_replay", __doc__.split("\n")[0])
    p.add_argument("--trace", type=Path, default=mooncake.DEFAULT_TRACE, help="Mooncake-format .jsonl")
    p.add_argument("--unit", type=int, default=16, help="trace tokens per replayed token (default 16)")
    p.add_argument("--pages", default="4,32", help="page sizes in replayed tokens (default 4,32: 64, 512)")
    p.add_argument("--policies", default="", help="comma-separated (default: every policy)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes for the (pool, policy) cells")
    p.add_argument(
        "--traces", default="first,second,full", help="which of first,second,full (halves by time)"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return bench_main("trace_replay", parse_args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
