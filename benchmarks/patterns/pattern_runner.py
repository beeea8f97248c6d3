"""Replay every pattern over the workloads and write the report: token-exact sections on tiny models with
real vocabularies, timed sections (interleaved rounds, TTFT curve) on the embedded model or a server.

``kvreuse bench patterns [--quick|--full] [--out DIR] [--server URL] [--patterns a,b] [--workloads w]``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kvreuse.benchmarks.patterns import select
from kvreuse.benchmarks.patterns.plan import Job, timed_jobs, token_jobs
from kvreuse.benchmarks.patterns.stacks import STACKS
from kvreuse.benchmarks.workloads import ALL_WORKLOADS

DEFAULT_OUT = Path("out/patterns")


def add_savings(runs: list[dict]) -> None:
    """Savings vs the naive run of the same workload (prefilled tokens and TTFT).

    Where naive did not run, its prefill is derived: with the cache off every prompt token of the
    append-only requests is prefilled (``savings_basis`` says which; TTFT savings need the measured run).
    """

    def key(r: dict) -> tuple:
        return (r["workload"], r.get("variant"), r.get("stack"), r.get("replies"), r.get("round", 0),
                r.get("prefix_cache", "radix"), r.get("page_size"))  # fmt: skip

    naive = {key(r): r["totals"] for r in runs if r["pattern"] == "naive"}
    derived = {key(r): r["totals"]["prompt_tokens"] for r in runs if r["pattern"] == "append_only"}
    for r in runs:
        n, t = naive.get(key(r)), r["totals"]
        base = n["prefilled_tokens"] if n is not None else derived.get(key(r))
        ok = base and t["prefilled_tokens"] is not None
        t["savings_vs_naive"] = 1 - t["prefilled_tokens"] / base if ok else None
        t["savings_basis"] = ("measured" if n is not None else "derived") if ok else None
        t["ttft_savings_vs_naive"] = 1 - t["ttft_s"] / n["ttft_s"] if n is not None and n["ttft_s"] else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="kvreuse bench patterns", description="Context-pattern KV-reuse benchmark"
    )
    ap.add_argument("--quick", action="store_true", help="a smoke run (a few patterns, one TTFT round)")
    ap.add_argument(
        "--full",
        action="store_true",
        help="add the agent-scale session (65 requests, ~17K static prefix) through the engine, two tokenizers",
    )
    ap.add_argument(
        "--accounting",
        action="store_true",
        help="with --full: the agent session through the engine's reuse rule instead of the engine (fast)",
    )
    ap.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="folder for report.md, PNG plots, results.json"
    )
    ap.add_argument(
        "--server",
        help="base URL of an OpenAI-compatible server: time its TTFT instead of the in-process engine",
    )
    ap.add_argument("--model", help="model for the timed runs (default: the embedded SmolLM2)")
    ap.add_argument("--served-model", help="model name to request from --server (default: its first model)")
    ap.add_argument("--patterns", help="comma-separated pattern names: only these (in every section)")
    ap.add_argument(
        "--workloads", help=f"comma-separated workloads from {','.join(ALL_WORKLOADS)}: only these"
    )
    ap.add_argument(
        "--stacks",
        help="comma-separated stacks for the token-exact jobs (default: the three real-vocabulary ones; "
        "smollm2: the --model's own tokenizer, e.g. a hybrid's)",
    )
    ap.add_argument(
        "--replies",
        choices=("cached", "replayed"),
        default=None,
        help="token-exact jobs: cached (forced decoding, default) or replayed (the first edition's mode)",
    )
    ap.add_argument(
        "--reply-kv",
        choices=("extend", "decode"),
        default="extend",
        help="cached replies: KV written by one extend step (default; equal counts, tests/test_reply_extend.py) "
        "or by forced decoding, one engine step per reply token",
    )
    ap.add_argument("--rounds", type=int, default=None, help="interleaved TTFT rounds (default 3, --quick 1)")
    ap.add_argument("--no-ttft", action="store_true", help="token-exact sections only (no timing)")
    ap.add_argument(
        "--curve", help="context lengths of the TTFT curve, comma-separated (default 512,1024,2048,4096)"
    )
    ap.add_argument("--no-tokens", action="store_true", help="timed sections only")
    ap.add_argument(
        "--max-tokens", type=int, default=1, help="tokens generated per timed request (replies replayed)"
    )
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument(
        "--kv-cache-memory", help="in-process engine: KV pool size (e.g. 64M: smaller than the work)"
    )
    ap.add_argument("--kv-host-memory", help="in-process engine: a host-memory KV tier below the pool")
    ap.add_argument("--kv-store", help="in-process engine: a disk KV tier (directory) below the pool")
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


def make_plan(args: argparse.Namespace) -> tuple[list[Job], list[Job]]:
    """(token-exact jobs, timed jobs), filtered by --patterns/--workloads; unknown names raise ValueError."""
    names = tuple(dict.fromkeys(x.strip() for x in (args.stacks or "").split(",") if x.strip()))
    if set(names) - set(STACKS):
        raise ValueError(f"unknown stack(s) {', '.join(sorted(set(names) - set(STACKS)))}")
    tokens = [] if args.no_tokens else token_jobs(args.full, args.quick, *([names] if names else []))
    timed = [] if args.no_ttft else timed_jobs(args.quick)
    if args.replies:
        tokens = [j._replace(replies=args.replies) for j in tokens]
    tokens = [j._replace(reply_kv=getattr(args, "reply_kv", "extend")) for j in tokens]
    if args.patterns:
        wanted = {p.name for p in select(args.patterns)}
        tokens, timed = [j for j in tokens if j.pattern in wanted], [j for j in timed if j.pattern in wanted]
    if args.workloads:
        names = {w.strip() for w in args.workloads.split(",") if w.strip()}
        if names - set(ALL_WORKLOADS):
            raise ValueError(f"unknown workload(s) {', '.join(sorted(names - set(ALL_WORKLOADS)))}")
        tokens, timed = [j for j in tokens if j.workload in names], [j for j in timed if j.workload in names]
    return list(dict.fromkeys(tokens)), timed


def main(argv: list[str] | None = None) -> int:
    from kvreuse.benchmarks.common import machine_info, progress
    from kvreuse.benchmarks.patterns.report import write_report
    from kvreuse.benchmarks.patterns.sections import run_timed, run_tokens

    args = parse_args(argv)
    try:
        tokens, timed = make_plan(args)
    except ValueError as e:
        print(f"error: {e}")
        return 2
    t0 = time.perf_counter()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    machine = machine_info()  # load average at the start; the end's is added below
    runs = run_tokens(tokens, args, progress)
    tokens_s = time.perf_counter() - t0
    timed_runs, curve, meta = run_timed(timed, args, progress) if timed else ([], [], {"target": "none"})
    for group in (runs, timed_runs):
        add_savings(group)
    meta.update({"quick": args.quick, "full": args.full, "page_size": args.page_size, "max_tokens": args.max_tokens,
                 "wall_s": time.perf_counter() - t0, "tokens_s": tokens_s, "threads": args.threads,
                 "machine": machine, "load_average_end": machine_info()["load_average"],
                 "stacks": {k: s.note for k, s in STACKS.items()}})  # fmt: skip
    if args.model and any(j.stack == "smollm2" for j in tokens):
        meta.setdefault("notes", []).append(
            f"Token-exact jobs of stack `smollm2` ran on `--model {Path(args.model).name}` itself ({args.page_size}-token "
            f"pages, --snapshot-every {args.snapshot_every} for hybrids), not on a tiny real-vocabulary model."
        )
    results = {"meta": meta, "runs": runs, "timed": timed_runs, "curve": curve}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    write_report(results, args.out)
    print(f"wrote {args.out / 'report.md'} ({meta['wall_s']:.0f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
