"""Eviction shadows on the Mooncake trace: what each shadow reports, which policy it would pick, what it costs.

Run from the repository root: ``python -m kvreuse.benchmarks.traces.trace_shadows [--quick] [--trace PATH]``.

No policy wins on every trace (``docs/traces.md``), so ``kvreuse serve --eviction-shadows`` replays
each finished request through page-only copies of the pool under other policies
(``runtime/cache/shadows.py``).  Here the default policy serves each trace (its two halves by time
and the whole, page 512 trace tokens, pools of 3/10/30% of the working set) through the token-level
harness (``benchmarks/traces/belady.py``) with shadows of the candidates; each candidate is also replayed
serving on its own.  Reported: each shadow's hit rate beside its own replay's (with one request in
flight they must be equal; with 8, the shadows see requests whole in finish order while the pool also
holds the running ones, so they estimate), the policy the shadows would pick against the one that is
best, and the harness's time with shadows over its time without, measured side by side.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kvreuse.benchmarks.common import base_parser, bench_main, format_table, progress, shown_path
from kvreuse.benchmarks.traces import mooncake
from kvreuse.benchmarks.traces.belady import belady, replay, working_set_pages
from kvreuse.benchmarks.traces.trace_replay import SHARES, hit_rate, pool_for, traces
from kvreuse.runtime.cache.eviction import DEFAULT_POLICY
from kvreuse.runtime.cache.manager import CacheManager

CANDIDATES = ("lru", "hazard", "proven", "answer")
CHUNK = 512  # the replay's and the shadows' prefill chunk (the engine's default)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def one_pool(trace, pool: int, page: int, candidates: tuple[str, ...], inflight: int) -> dict:
    """Serve with the default and shadows of ``candidates``; each candidate served on its own; ``inflight``
    requests in the scheduler at once."""
    plain, t_plain = timed(lambda: replay(trace, pool, page, DEFAULT_POLICY, CHUNK, False, inflight=inflight))
    cache = CacheManager(pool, page, "radix", DEFAULT_POLICY, shadows=candidates, chunk_size=CHUNK)
    shadows = cache.shadows
    served, t_shadowed = timed(
        lambda: replay(trace, pool, page, DEFAULT_POLICY, CHUNK, False, cache, inflight)
    )
    assert served == plain, "shadows changed what the pool served"
    st = shadows.stats()
    assert st is not None
    shadow = {p: n / st.prompt_tokens for p, n in st.cached_tokens.items()}
    own = {
        p: hit_rate(trace, replay(trace, pool, page, p, CHUNK, False, inflight=inflight)) for p in candidates
    }
    picked, best = max(shadow, key=shadow.__getitem__), max(own, key=own.__getitem__)
    return {
        "pool_pages": pool, "belady": hit_rate(trace, belady(trace, pool, page)), "served": hit_rate(trace, served),
        "shadow_hit_rate": shadow, "own_hit_rate": own, "equal": all(shadow[p] == own[p] for p in candidates),
        "max_abs_error": max(abs(shadow[p] - own[p]) for p in candidates),
        "picked": picked, "best": best, "picked_x_best": own[picked] / own[best] if own[best] else 1.0,
        "seconds_plain": t_plain, "seconds_with_shadows": t_shadowed, "overhead_x": t_shadowed / t_plain,
        "ms_per_request_per_shadow": (t_shadowed - t_plain) / len(trace) / len(candidates) * 1e3,
    }  # fmt: skip


def run(args: argparse.Namespace) -> dict:
    candidates = tuple(args.candidates.split(","))
    results: dict[str, dict] = {}
    rows = []
    for name, reqs in traces(args.trace, args.quick, args.traces.split(",")).items():
        trace = mooncake.materialise(reqs, args.unit)
        ws = working_set_pages(trace, args.page)
        for inflight in (int(x) for x in args.inflight.split(",")):
            by_share = results.setdefault(f"inflight_{inflight}", {}).setdefault(name, {})
            for share in SHARES:
                progress(f"{name}, {inflight} in flight, pool {share:.0%}")
                pool = pool_for(trace, share, args.page, ws)
                r = by_share[f"{share:.2f}"] = one_pool(trace, pool, args.page, candidates, inflight)
                rows.append([name, inflight, f"{share:.0%}", r["belady"], *(f"{r['shadow_hit_rate'][p]:.3f} / {r['own_hit_rate'][p]:.3f}" for p in candidates),
                             r["max_abs_error"], r["picked"], r["best"], r["picked_x_best"], r["overhead_x"], r["ms_per_request_per_shadow"]])  # fmt: skip
    print(format_table(["trace", "in flight", "pool", "Belady", *(f"{p} shadow / own" for p in candidates), "max error",
                        "picked", "best", "picked x best", "time x", "ms/request/shadow"], rows))  # fmt: skip
    return {"dtype": "none (token level, no model)", "threads": 1, "trace": shown_path(args.trace), "unit": args.unit,
            "page_trace_tokens": args.page * args.unit, "serving": DEFAULT_POLICY, "candidates": list(candidates),
            "chunk": CHUNK, "traces": results}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("trace_shadows", __doc__.split("\n")[0])
    p.add_argument("--trace", type=Path, default=mooncake.DEFAULT_TRACE, help="Mooncake-format .jsonl")
    p.add_argument("--unit", type=int, default=16, help="trace tokens per replayed token (default 16)")
    p.add_argument("--page", type=int, default=32, help="page size in replayed tokens (default 32: 512)")
    p.add_argument("--candidates", default=",".join(CANDIDATES), help="the shadows' policies")
    p.add_argument(
        "--inflight", default="1,8", help="requests in the scheduler at once, one run each (default 1,8)"
    )
    p.add_argument(
        "--traces", default="first,second,full", help="which of first,second,full (halves by time)"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return bench_main("trace_shadows", parse_args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
