"""TTFT that can be trusted: interleaved rounds of whole pattern runs, and a TTFT-vs-context curve.

Each round runs every timed pattern once from an empty cache, in an order rotated by one each round
(A B C, B C A, C A B), so slow phases of a shared machine are spread over all patterns instead of hitting
one.  Per request and per pattern the report gives the median over rounds and the spread (min-max).
The curve times a cold prefill of L tokens (cache off) and a warm one (L-token prefix cached, 64 new
tokens) for a few L, interleaved the same way.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

WARM_NEW_TOKENS = 64


def rotated(items: list[Any], r: int) -> list[Any]:
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


def summarize_rounds(rounds: list[list[dict]]) -> list[dict]:
    """Merge the runs of several rounds (same patterns) into one run per pattern with medians and spreads."""
    by_name: dict[str, list[dict]] = {}
    for runs in rounds:
        for run in runs:
            by_name.setdefault(run["pattern"], []).append(run)
    merged = []
    for runs in by_name.values():
        base = dict(runs[0])
        totals = [sum(r["ttft_s"] for r in run["requests"]) for run in runs]
        base["ttft_rounds"] = totals
        base["totals"] = dict(
            base["totals"], ttft_s=statistics.median(totals), ttft_min=min(totals), ttft_max=max(totals)
        )
        rows = []
        for i, row in enumerate(runs[0]["requests"]):
            vals = [run["requests"][i]["ttft_s"] for run in runs]
            if any(run["requests"][i]["prefilled_tokens"] != row["prefilled_tokens"] for run in runs):
                raise AssertionError(f"{base['pattern']} request {i}: token counts differ between rounds")
            rows.append(dict(row, ttft_s=statistics.median(vals), ttft_min=min(vals), ttft_max=max(vals)))
        base["requests"] = rows
        merged.append(base)
    return merged


def context_curve(engine: Any, lengths: list[int], reps: int, progress: Callable[[str], None]) -> list[dict]:
    """Cold and warm TTFT per context length, medians and spreads over interleaved repetitions."""
    from kvreuse.benchmarks.common import synthetic_prompt
    from kvreuse.runtime.sampling.params import SamplingParams

    one = SamplingParams(max_tokens=1)
    samples: dict[tuple[int, str], list[float]] = {}
    for r in range(reps):
        for n in rotated(lengths, r):
            prompt = synthetic_prompt(n + WARM_NEW_TOKENS, seed=1000 * r + n)
            engine.reset_prefix_cache()
            cold = engine.generate([prompt[:n]], one)[0]
            warm = engine.generate([prompt], one)[0]  # its first n tokens' whole pages are cached now
            samples.setdefault((n, "cold"), []).append(cold.ttft_s)
            samples.setdefault((n, "warm"), []).append(warm.ttft_s)
            progress(f"curve L={n} round {r}: cold {cold.ttft_s:.2f}s warm {warm.ttft_s:.2f}s")
    out = []
    for n in lengths:
        c, w = samples[(n, "cold")], samples[(n, "warm")]
        out.append({"context": n, "cold_median": statistics.median(c), "cold_min": min(c), "cold_max": max(c),
                    "warm_median": statistics.median(w), "warm_min": min(w), "warm_max": max(w)})  # fmt: skip
    return out
