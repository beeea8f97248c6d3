"""Replay every pattern over the workloads against a target and write the report.

``kvreuse bench patterns [--quick] [--out DIR] [--server URL] [--model M] [--patterns a,b]``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.patterns import Pattern, ideal_prefill, select
from benchmarks.patterns.ideal import best_prefix
from benchmarks.targets import TEMPLATE, InProcessTarget, Measured, ServerTarget
from benchmarks.workloads import WORKLOADS, Trajectory, load

DEFAULT_OUT = Path("benchmarks/results/patterns")


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
    target: Any, tokenizer: Any, pattern: Pattern, traj: Trajectory, tick: Any, page: int
) -> dict:
    """One pattern over one workload from an empty cache; returns per-request rows and totals."""
    rendered = render_all(tokenizer, pattern, traj)
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
        rows.append(row)
        tick()
    ids = [rp.token_ids for rp in rendered]
    streams = [list(p) + list(o) for p, o in zip(ids, outputs, strict=True)]
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
    """Savings vs the naive run of the same workload (prefilled tokens and TTFT)."""
    naive = {r["workload"]: r["totals"] for r in runs if r["pattern"] == "naive"}
    for r in runs:
        n, t = naive.get(r["workload"]), r["totals"]
        ok = n is not None and t["prefilled_tokens"] is not None and n["prefilled_tokens"]
        t["savings_vs_naive"] = 1 - t["prefilled_tokens"] / n["prefilled_tokens"] if ok else None
        t["ttft_savings_vs_naive"] = 1 - t["ttft_s"] / n["ttft_s"] if n is not None and n["ttft_s"] else None


def make_target(args: argparse.Namespace) -> tuple[Any, Any, int, dict]:
    import transformers

    from runtime.model_source import resolve_model

    if args.server:
        target = ServerTarget(args.server, args.served_model, max_tokens=args.max_tokens)
        tok = transformers.AutoTokenizer.from_pretrained(resolve_model(args.model)[0])
        return target, tok, args.page_size, {"target": "server", "url": args.server, "model": target.model}
    from runtime.engine import Engine

    engine = Engine(args.model, page_size=args.page_size)
    meta = {
        "target": "in-process",
        "model": engine.model_name,
        "dtype": str(engine.dtype),
        "device": str(engine.device),
    }
    return InProcessTarget(engine, max_tokens=args.max_tokens), engine.tokenizer, args.page_size, meta


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="kvreuse bench patterns", description="Context-pattern KV-reuse benchmark"
    )
    ap.add_argument("--quick", action="store_true", help="short workloads (under 2 minutes on 2 CPU cores)")
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
        "--max-tokens", type=int, default=4, help="tokens generated per request (reply is ignored)"
    )
    ap.add_argument("--page-size", type=int, default=16)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from rich.progress import Progress

    from benchmarks.report import write_report

    args = parse_args(argv)
    try:
        plan = make_plan(args)
    except ValueError as e:
        print(f"error: {e}")
        return 2
    t0 = time.perf_counter()
    target, tokenizer, page, meta = make_target(args)
    runs = []
    with Progress() as progress:
        task = progress.add_task("patterns", total=sum(len(t.turns) * len(ps) for t, ps in plan))
        for traj, patterns in plan:
            for p in patterns:
                progress.update(task, description=f"{traj.name}:{p.name}")
                runs.append(run_pattern(target, tokenizer, p, traj, lambda: progress.advance(task), page))
    add_savings(runs)
    meta.update({"quick": args.quick, "page_size": page, "max_tokens": args.max_tokens, "template": TEMPLATE,
                 "wall_s": time.perf_counter() - t0})  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    write_report({"meta": meta, "runs": runs}, args.out)
    print(f"wrote {args.out / 'report.md'} ({meta['wall_s']:.0f}s)")
    return 0


# Which patterns run on which workload by default. Every pattern runs on the coding agent; the other
# workloads add what they are for (long tool results -> compression; fan-out -> shared prefixes), which
# keeps the run within its time budget on 2 CPU cores (see the report's wall time).
DEFAULT_PLAN = {
    "coding": None,
    "research": ["append_only", "naive", "compress_budget", "compress_summary", "sliding_window"],
    "fanout": ["append_only", "naive", "timestamp_start"],
}
QUICK_PLAN = {"coding": ["append_only", "naive", "timestamp_start", "timestamp_end", "tools_reordered"]}


def make_plan(args: argparse.Namespace) -> list[tuple[Trajectory, list[Pattern]]]:
    """(workload, patterns) pairs: --workloads/--patterns override the default plan."""
    base = QUICK_PLAN if args.quick else DEFAULT_PLAN
    names = [w.strip() for w in args.workloads.split(",") if w.strip()] if args.workloads else list(base)
    variant = "quick" if args.quick else "default"
    plan = []
    for name in names:
        chosen = args.patterns or (",".join(base[name]) if base.get(name) else None)
        plan.append((load(name, variant), select(chosen)))
    return plan


if __name__ == "__main__":
    raise SystemExit(main())
