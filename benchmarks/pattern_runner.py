"""Replay every pattern over the workloads against a target and write the report.

``kvreuse bench patterns [--quick] [--out DIR] [--server URL] [--model M] [--patterns a,b]``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.patterns import PATTERNS, Pattern, ideal_prefill, select
from benchmarks.patterns.checks import change_start
from benchmarks.patterns.ideal import best_prefix, computed_streams
from benchmarks.patterns.projection import CostModel, expected_prefill
from benchmarks.targets import TEMPLATE, InProcessTarget, Measured, ServerTarget
from benchmarks.workloads import WORKLOADS, Trajectory, load

DEFAULT_OUT = Path("benchmarks/results/patterns")
OVERHEAD_TOKENS = 50  # a request's fixed cost (decode step, sampling, bookkeeping) in prefill-token units


def render_all(tokenizer: Any, pattern: Pattern, traj: Trajectory) -> list[Any]:
    from chat_templates import render

    return [
        render(tokenizer, r.messages, r.tools, template=TEMPLATE, **r.template_kwargs)
        for r in pattern.requests(traj)
    ]


def divergence(rendered: list[Any], traj: Trajectory, k: int) -> dict[str, Any]:
    """Where request k first differs from the previous request of its thread, and in which segment."""
    from chat_templates import first_divergence, locate

    earlier = [j for j in traj.thread_turns(k)[:-1]] or list(range(k))
    if not earlier:
        return {"divergence": None, "prev_tokens": None, "segment": None, "message_index": None}
    prev = rendered[earlier[-1]].token_ids
    cur = rendered[k]
    d = first_divergence(prev, cur.token_ids)
    seg = locate(cur, d) if d < len(cur.token_ids) else None
    return {
        "divergence": d,
        "prev_tokens": len(prev),
        "segment": seg.kind if seg else None,
        "message_index": seg.message_index if seg else None,
    }


def run_pattern(
    target: Any,
    tokenizer: Any,
    pattern: Pattern,
    traj: Trajectory,
    tick: Any,
    page: int,
    rendered: list[Any] | None = None,
) -> dict:
    """One pattern over one workload from an empty cache; returns per-request rows and totals.

    ``tick(row)`` is called after each request with its measured row.
    """
    rendered = rendered if rendered is not None else render_all(tokenizer, pattern, traj)
    reqs = pattern.requests(traj)
    target.reset()
    rows, outputs = [], []
    for k, (req, rp) in enumerate(zip(reqs, rendered, strict=True)):
        m: Measured = target.send(req, rp.token_ids, pattern.cache)
        outputs.append(m.output_token_ids)
        row = {"turn": k, "thread": traj.turns[k].thread, "prompt_tokens": m.prompt_tokens,
               "rendered_tokens": len(rp.token_ids), "cached_tokens": m.cached_tokens,
               "prefilled_tokens": m.prefilled_tokens, "ttft_s": m.ttft_s, "prefill_s": m.prefill_s,
               "decode_s": m.decode_s}  # fmt: skip
        row.update(divergence(rendered, traj, k))
        prev = (traj.thread_turns(k)[:-1] or list(range(k)) or [None])[-1]
        row["change_start"] = (
            None if prev is None else change_start(pattern.name, reqs[prev], req, rp, tokenizer)
        )
        rows.append(row)
        tick(row)
    ids = [rp.token_ids for rp in rendered]
    streams = computed_streams(ids, outputs)
    for k, row in enumerate(rows):
        reusable = best_prefix(ids[k], streams[:k]) if pattern.cache else 0
        row["ideal_tokens"] = max(1, len(ids[k]) - reusable) if pattern.cache else len(ids[k])
        row["ideal_paged_tokens"] = (
            max(1, len(ids[k]) - reusable // page * page) if pattern.cache else len(ids[k])
        )
    assert [r["ideal_tokens"] for r in rows] == (
        ideal_prefill(ids, outputs) if pattern.cache else [len(i) for i in ids]
    )
    return {"workload": traj.name, "variant": traj.variant, "pattern": pattern.name, "claim": pattern.claim,
            "cache": pattern.cache, "requests": rows, "totals": totals(rows), "reset_note": target.reset_note}  # fmt: skip


def _sum(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows]
    return None if any(v is None for v in vals) else sum(vals)


def totals(rows: list[dict]) -> dict[str, Any]:
    t = {k: _sum(rows, k) for k in ("prompt_tokens", "cached_tokens", "prefilled_tokens", "ideal_tokens",
                                     "ideal_paged_tokens", "ttft_s", "prefill_s", "decode_s")}  # fmt: skip
    t["reuse_ratio"] = None if t["cached_tokens"] is None else t["cached_tokens"] / max(1, t["prompt_tokens"])
    t["distance_to_ideal"] = (
        None if t["prefilled_tokens"] is None else t["prefilled_tokens"] - t["ideal_tokens"]
    )
    t["max_context"] = max(r["prompt_tokens"] for r in rows)
    return t


def add_savings(runs: list[dict]) -> None:
    """Savings vs the naive run of the same workload (prefilled tokens and TTFT).

    Where naive did not run, its prefill is derived: with the cache off every prompt token of the
    append-only requests is prefilled (``savings_basis`` says which; TTFT savings need the measured run).
    """
    naive = {r["workload"]: r["totals"] for r in runs if r["pattern"] == "naive"}
    derived = {r["workload"]: r["totals"]["prompt_tokens"] for r in runs if r["pattern"] == "append_only"}
    for r in runs:
        n, t = naive.get(r["workload"]), r["totals"]
        base = n["prefilled_tokens"] if n is not None else derived.get(r["workload"])
        ok = base and t["prefilled_tokens"] is not None
        t["savings_vs_naive"] = 1 - t["prefilled_tokens"] / base if ok else None
        t["savings_basis"] = ("measured" if n is not None else "derived") if ok else None
        t["ttft_savings_vs_naive"] = 1 - t["ttft_s"] / n["ttft_s"] if n is not None and n["ttft_s"] else None


def make_target(args: argparse.Namespace) -> tuple[Any, Any, int, dict]:
    import transformers

    from runtime.model_source import resolve_model

    if args.server:
        target = ServerTarget(args.server, args.served_model, max_tokens=args.max_tokens)
        tok = transformers.AutoTokenizer.from_pretrained(resolve_model(args.model)[0])
        return target, tok, args.page_size, {"target": "server", "url": args.server, "model": target.model}
    from runtime.engine import Engine

    engine = Engine(args.model, page_size=args.page_size, snapshot_every=args.snapshot_every)
    meta = {
        "target": "in-process",
        "model": engine.model_name,
        "dtype": str(engine.dtype),
        "device": str(engine.device),
        "snapshot_every": args.snapshot_every,
    }
    return InProcessTarget(engine, max_tokens=args.max_tokens), engine.tokenizer, args.page_size, meta


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="kvreuse bench patterns", description="Context-pattern KV-reuse benchmark"
    )
    ap.add_argument("--quick", action="store_true", help="short workloads (under 2 minutes on 2 CPU cores)")
    ap.add_argument(
        "--full",
        action="store_true",
        help="every pattern on every workload it applies to (~14 min on 2 cores)",
    )
    ap.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="folder for report.md, PNG plots, results.json"
    )
    ap.add_argument(
        "--server", help="base URL of an OpenAI-compatible server instead of the in-process engine"
    )
    ap.add_argument("--model", help="model for the in-process engine (and the tokenizer used for accounting)")
    ap.add_argument("--served-model", help="model name to request from --server (default: its first model)")
    ap.add_argument("--patterns", help="comma-separated pattern names (default: all)")
    ap.add_argument("--workloads", help=f"comma-separated workloads from {','.join(WORKLOADS)}")
    ap.add_argument(
        "--max-tokens", type=int, default=2, help="tokens generated per request (reply is ignored)"
    )
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument(
        "--snapshot-every",
        type=int,
        default=0,
        help="hybrid models: state snapshots every K pages in a chunk",
    )
    ap.add_argument(
        "--threads", type=int, help="torch CPU threads (default: torch's choice; 1 on a busy machine)"
    )
    return ap.parse_args(argv)


def execute(
    plan: list[tuple[Trajectory, list[Pattern]]], target: Any, tokenizer: Any, page: int, t0: float
) -> list[dict]:
    """Run the plan under a progress bar (in expected prefill tokens); print a projection after the first pattern."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    jobs = []
    for traj, patterns in plan:
        for p in patterns:
            rendered = render_all(tokenizer, p, traj)
            jobs.append((traj, p, rendered, expected_prefill([r.token_ids for r in rendered], p.cache, page)))
    model = CostModel()
    runs: list[dict] = []
    columns = (TextColumn("{task.description:<34}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
               TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn())  # fmt: skip
    with Progress(*columns) as progress:
        task = progress.add_task("patterns", total=sum(sum(e) + OVERHEAD_TOKENS * len(e) for *_, e in jobs))
        for i, (traj, p, rendered, expected) in enumerate(jobs):
            progress.update(task, description=f"{traj.name}:{p.name}")

            def tick(row: dict, expected: list[int] = expected) -> None:
                model.add(row["prefilled_tokens"] or 0, row["ttft_s"] + (row["decode_s"] or 0.0))
                progress.advance(task, expected[row["turn"]] + OVERHEAD_TOKENS)

            runs.append(run_pattern(target, tokenizer, p, traj, tick, page, rendered))
            if i == 0 and len(jobs) > 1:
                elapsed = time.perf_counter() - t0
                left = model.seconds_for([t for *_, e in jobs[1:] for t in e])
                a, b = model.coefficients()
                progress.console.print(
                    f"elapsed {elapsed:.0f}s (model load included); projected total ~{elapsed + left:.0f}s "
                    f"for {sum(sum(e) for *_, e in jobs):,} expected prefill tokens in {len(jobs)} pattern runs "
                    f"({1 / a if a else float('inf'):.0f} prefill tokens/s, {b:.2f}s per request)"
                )
    return runs


def main(argv: list[str] | None = None) -> int:
    from benchmarks.report import write_report

    args = parse_args(argv)
    try:
        plan = make_plan(args)
    except ValueError as e:
        print(f"error: {e}")
        return 2
    t0 = time.perf_counter()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    target, tokenizer, page, meta = make_target(args)
    load_s = time.perf_counter() - t0
    runs = execute(plan, target, tokenizer, page, t0)
    add_savings(runs)
    meta.update({"quick": args.quick, "full": args.full, "page_size": page, "max_tokens": args.max_tokens, "template": TEMPLATE,
                 "wall_s": time.perf_counter() - t0, "load_s": load_s, "threads": args.threads})  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    write_report({"meta": meta, "runs": runs}, args.out)
    print(f"wrote {args.out / 'report.md'} ({meta['wall_s']:.0f}s)")
    return 0


# Which patterns run on which workload. ``--full`` runs every pattern whose claim the coding agent can
# show on it (10 turns, ~2K static prefix: patterns that recompute the whole prompt cost turns x context),
# compression on the research agent (long tool results) and the fan-out (sub-agents sharing the parent's
# prefix): ~14 minutes on 2 idle CPU cores. The default keeps the acceptance patterns, the status
# bar and formatting pairs and the fan-out, and fits 10 minutes; the ~80 s heavy patterns left out
# (status bar in the system prompt, user profile, unstable text, compression) are in --full. Naive runs
# once; elsewhere its prefill is derived (cache off prefills every prompt token of the append-only requests).
CODING_PATTERNS = [n for n in PATTERNS if n not in ("compress_budget", "compress_summary")]
FULL_PLAN = {
    "coding": CODING_PATTERNS,
    "research": ["append_only", "compress_budget", "compress_summary"],
    "fanout": ["append_only"],
}
DEFAULT_PLAN = {
    "coding": [
        "append_only",
        "naive",
        "timestamp_start",
        "timestamp_end",
        "tools_reordered",
        "sliding_window",
        "status_replace",
        "status_append",
        "text_stable",
        "reasoning_stripped",
    ],
    "fanout": ["append_only"],
}
QUICK_PLAN = {
    "coding": [
        "append_only",
        "naive",
        "timestamp_start",
        "timestamp_end",
        "tools_reordered",
        "sliding_window",
    ]
}


def make_plan(args: argparse.Namespace) -> list[tuple[Trajectory, list[Pattern]]]:
    """(workload, patterns) pairs: --workloads/--patterns override the default plan."""
    base = QUICK_PLAN if args.quick else FULL_PLAN if args.full else DEFAULT_PLAN
    names = [w.strip() for w in args.workloads.split(",") if w.strip()] if args.workloads else list(base)
    variant = "quick" if args.quick else "default"
    plan = []
    for name in names:
        chosen = args.patterns or (",".join(base[name]) if base.get(name) else None)
        plan.append((load(name, variant), select(chosen)))
    return plan


if __name__ == "__main__":
    raise SystemExit(main())
