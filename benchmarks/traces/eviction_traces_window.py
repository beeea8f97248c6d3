"""Eviction policies on the eviction traces for a sliding-window model, against Belady with window state.

Run from the repository root: ``python -m kvreuse.benchmarks.traces.eviction_traces_window [--quick] [--out PATH]``.

The three traces and pool sizes of ``benchmarks/traces/eviction_traces.py`` (cyclic, subagents, zipf), run
through a window model's cache (Gemma 3/4 with window paging): the pool holds the full-attention
layers' pages, ``NodeStates`` the window snapshots in their own budget, and a hit must end at a
snapshot (``benchmarks/traces/window_belady.py``).  Two snapshot budgets per trace, in snapshots (every
snapshot of a model has one size, so ``--snapshot-memory`` is a count of them):

* ``tight``: as many snapshots as the pool holds requests (pool pages over the trace's mean request
  pages: cyclic's pool holds 7 of its 8 conversations, so does its snapshot budget);
* ``ample``: more than the trace ever places (the budget never binds; hits still end at snapshots).

Per trace and budget: the Belady-style reference with window state (``belady_window``), Belady on
the pages alone (``belady``, window state ignored: an upper bound), and every policy of
``kvreuse.runtime.cache.eviction.POLICIES`` replayed through the real scheduler, cache manager, radix tree
and ``NodeStates`` (token level, no model).  ``bound_holds``: no policy above the reference.  A short
cyclic trace also runs through an Engine on a tiny random Gemma 3 for every policy, and its
per-request ``cached_tokens`` must equal the window replay of the same requests (the result also
holds the replays that ignore snapshots or their budget, which differ: the check sees both).
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

from kvreuse.benchmarks.common import base_parser, bench_main, format_table, progress
from kvreuse.benchmarks.traces.belady import Trace, belady, replay
from kvreuse.benchmarks.traces.eviction_traces import PAGE, build, cyclic_steps, hit_rate, traces
from kvreuse.benchmarks.traces.window_belady import belady_window, window_cache
from kvreuse.runtime.cache.eviction import DEFAULT_POLICY, POLICIES

CHUNK = 512  # the engine's default chunk size: where long prompts' prefill chunks end


def budgets(trace: Trace, pool: int) -> dict[str, int]:
    """Snapshot budgets (in snapshots) of the two setups (module docstring)."""
    mean_pages = sum(-(-(len(p) + len(o) - 1) // PAGE) for p, o in trace) / len(trace)
    return {"tight": max(1, int(pool / mean_pages)), "ample": 4 * len(trace)}


def window_replay(
    trace: Trace, pool: int, policy: str, snapshots: int, chunk_size: int = CHUNK, **kw
) -> list[int]:
    """Cached tokens per request through the engine's window-model cache (``replay`` over ``window_cache``)."""
    return replay(
        trace, pool, PAGE, policy, chunk_size, cache=window_cache(pool, PAGE, policy, snapshots), **kw
    )


def engine_check_window(policies: list[str], snapshots: int = 6) -> dict:
    """A short cyclic trace through the Engine on a tiny random Gemma 3 (window 7, page 16) with a
    ``snapshots``-snapshot budget: cached tokens per request == the window replay of the same requests."""
    from kvreuse.runtime.engine.engine import Engine
    from kvreuse.runtime.sampling.params import SamplingParams
    from tests.helpers import make_tiny_windowed

    n_conv, first, new, out, chunk = 3, 90, 13, 21, 64
    pool = (n_conv - 1) * -(-(first + 3 * (new + out)) // PAGE)
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_windowed(Path(tmp) / "tiny", "gemma3-odd")
        opts = dict(model_dir=str(model), dtype="float32", device="cpu", page_size=PAGE, num_pages=pool,
                    chunk_size=chunk)  # fmt: skip
        snap_bytes = Engine(**opts).runner.state_pool.snapshot_bytes
        for policy in policies:
            eng = Engine(**opts, eviction_policy=policy, snapshot_memory=snapshots * snap_bytes)
            engine_cached = []

            def generate(prompt, n, eng=eng, engine_cached=engine_cached):
                o = eng.generate(prompt, SamplingParams(max_tokens=n, ignore_eos=True))[0]
                eng.cache.check_integrity()
                engine_cached.append(o.cached_tokens)
                return o.output_token_ids

            rng = random.Random(7)
            steps = cyclic_steps(rng, 512, n_conv=n_conv, rounds=4, first=first, new=new, out=out)
            trace = build(steps, rng, 512, generate)
            token_level = window_replay(trace, pool, policy, snapshots, chunk)
            no_snapshots = replay(trace, pool, PAGE, policy, chunk)  # as if a dense model's
            # as if no snapshot were ever evicted
            roomy = window_replay(trace, pool, policy, 4 * len(trace), chunk)
            states = eng.cache.prefix.states.stats()
            result[policy] = {"requests": len(trace), "engine_cached": engine_cached, "replay_cached": token_level,
                              "dense_replay_cached": no_snapshots, "ample_replay_cached": roomy, "equal": engine_cached == token_level,
                              "snapshots_evicted": states.evicted, "snapshot_cut": eng.stats().snapshot_cut_tokens}  # fmt: skip
    return result


def run(args: argparse.Namespace) -> dict:
    policies = list(POLICIES)
    results, rows = {}, []
    for name, (trace, pool) in traces(args.quick).items():
        dense = hit_rate(trace, belady(trace, pool, PAGE))
        results[name] = {
            "requests": len(trace),
            "pool_pages": pool,
            "belady_pages_only": dense,
            "budgets": {},
        }
        for setup, snaps in budgets(trace, pool).items():
            opt = hit_rate(trace, belady_window(trace, pool, PAGE, snaps, CHUNK))
            rates = {}
            for policy in policies:
                rates[policy] = hit_rate(
                    trace, window_replay(trace, pool, policy, snaps, check=not args.quick)
                )
                progress(f"{name} {setup} {policy}: {rates[policy]:.3f} (belady with window state {opt:.3f})")
            results[name]["budgets"][setup] = {
                "snapshots": snaps, "belady_window": opt, "hit_rate": rates,
                "x_belady_window": {p: r / opt if opt else float("nan") for p, r in rates.items()},
                "bound_holds": max(rates.values()) <= opt + 1e-9,
            }  # fmt: skip
            rows += [
                [name, setup, snaps, p, r, r / opt if opt else float("nan"), opt, dense]
                for p, r in rates.items()
            ]
    headers = ["trace", "budget", "snapshots", "policy", "hit rate", "x Belady(window)", "Belady(window)",
               "Belady(pages only)"]  # fmt: skip
    print(format_table(headers, rows))
    check = engine_check_window(policies)
    print("engine check:", {p: c["equal"] for p, c in check.items()})
    return {"dtype": "float32 (engine check)", "page_size": PAGE, "chunk_size": CHUNK, "default_policy": DEFAULT_POLICY,
            "traces": results, "engine_check": check}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return base_parser("eviction_traces_window", __doc__.split("\n")[0]).parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return bench_main("eviction_traces_window", parse_args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
