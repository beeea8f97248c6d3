"""Replay every pattern over the workloads and write the report: token-exact sections on tiny models with
real vocabularies, timed sections (interleaved rounds, TTFT curve) on the embedded model or a server.

``kvreuse bench patterns [--quick|--full] [--out DIR] [--server URL] [--patterns a,b] [--workloads w]``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.patterns import Pattern, ideal_prefill, select
from benchmarks.patterns.checks import change_start
from benchmarks.patterns.ideal import best_prefix, computed_streams
from benchmarks.patterns.plan import Job, timed_jobs, token_jobs
from benchmarks.patterns.snapshots import SnapshotPolicy, expected_reuse
from benchmarks.patterns.stacks import STACKS, Stack, render_request, reply_tokens, template_source
from benchmarks.targets import Measured
from benchmarks.workloads import ALL_WORKLOADS, Trajectory

DEFAULT_STACK = STACKS["smollm2"]

DEFAULT_OUT = Path("out/patterns")


def render_all(
    tokenizer: Any,
    pattern: Pattern,
    traj: Trajectory,
    stack: Stack = DEFAULT_STACK,
    replies: str = "cached",
    fast: Any = None,
) -> tuple[list[Any], list[list[int]] | None]:
    """Every request's rendering and, with cached replies, the reply ids each request generates."""
    source = template_source(stack, tokenizer, pattern.template)
    reqs = pattern.requests(traj)
    if fast is not None:  # no segments: text and ids only (``fast`` is a PieceTokenizer)
        from chat_templates import RenderedPrompt, render_text

        texts = [render_text(tokenizer, r.messages, r.tools, template=source, **{**r.template_kwargs, **stack.kwargs})
                 for r in reqs]  # fmt: skip
        rendered = [RenderedPrompt(t, fast(t), []) for t in texts]
    else:
        rendered = [render_request(tokenizer, source, stack, r) for r in reqs]
    if replies != "cached":
        return rendered, None
    forced = [
        reply_tokens(tokenizer, source, stack, req, rp, traj.turns[k].assistant)
        for k, (req, rp) in enumerate(zip(reqs, rendered, strict=True))
    ]
    return rendered, forced


def divergence(rendered: list[Any], traj: Trajectory, k: int) -> dict[str, Any]:
    """Where request k first differs from the previous request of its thread, and in which segment."""
    from chat_templates import first_divergence, locate

    earlier = [j for j in traj.thread_turns(k)[:-1]] or list(range(k))
    if not earlier:
        return {"divergence": None, "prev_tokens": None, "segment": None, "message_index": None}
    prev = rendered[earlier[-1]].token_ids
    cur = rendered[k]
    d = first_divergence(prev, cur.token_ids)
    seg = locate(cur, d) if d < len(cur.token_ids) and cur.segments else None
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
    rendered: tuple[list[Any], list[list[int]] | None] | None = None,
    stack: Stack = DEFAULT_STACK,
    replies: str = "cached",
) -> dict:
    """One pattern over one workload from an empty cache; returns per-request rows and totals.

    ``replies="cached"`` forces each turn's reply through the target as generated output (its KV is
    cached); ``"replayed"`` generates ``max_tokens`` throwaway tokens and the next turn prefills the reply.
    ``tick(row)`` is called after each request with its measured row.
    """
    rendered, forced = (
        rendered if rendered is not None else render_all(tokenizer, pattern, traj, stack, replies)
    )
    reqs = pattern.requests(traj)
    target.reset()
    rows, outputs = [], []
    for k, (req, rp) in enumerate(zip(reqs, rendered, strict=True)):
        m: Measured = target.send(req, rp.token_ids, pattern.cache, forced[k] if forced else None)
        outputs.append(m.output_token_ids)
        row = {"turn": k, "thread": traj.turns[k].thread, "prompt_tokens": m.prompt_tokens,
               "rendered_tokens": len(rp.token_ids), "cached_tokens": m.cached_tokens,
               "prefilled_tokens": m.prefilled_tokens, "generated_tokens": len(m.output_token_ids),
               "ttft_s": m.ttft_s, "prefill_s": m.prefill_s, "decode_s": m.decode_s,
               "snapshot_cut": m.snapshot_cut}  # fmt: skip
        if m.cached_host_tokens or m.cached_disk_tokens:  # where the hit came from (KV tiers)
            row.update(cached_host_tokens=m.cached_host_tokens, cached_disk_tokens=m.cached_disk_tokens)
        row.update(divergence(rendered, traj, k))
        prev = (traj.thread_turns(k)[:-1] or list(range(k)) or [None])[-1]
        row["change_start"] = (
            None
            if prev is None or not rp.segments
            else change_start(pattern.name, reqs[prev], req, rp, tokenizer)
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
    policy = getattr(target, "snapshot_policy", None)
    if policy is not None and pattern.cache:  # a hybrid: what the snapshot policy says it reuses
        for row, e in zip(rows, expected_reuse(SnapshotPolicy(*policy), ids, outputs), strict=True):
            row["snapshot_expected"], row["snapshot_cut_expected"] = e.cached, e.cut
    return {"workload": traj.name, "variant": traj.variant, "pattern": pattern.name, "claim": pattern.claim,
            "stack": stack.name, "replies": replies, "cache": pattern.cache, "requests": rows,
            "totals": totals(rows), "reset_note": target.reset_note}  # fmt: skip


def _sum(rows: list[dict], key: str) -> float | None:
    vals = [r.get(key) for r in rows]
    return None if any(v is None for v in vals) else sum(vals)


def totals(rows: list[dict]) -> dict[str, Any]:
    t = {k: _sum(rows, k) for k in ("prompt_tokens", "cached_tokens", "prefilled_tokens", "ideal_tokens",
                                     "ideal_paged_tokens", "generated_tokens", "ttft_s", "prefill_s", "decode_s",
                                     "snapshot_cut")}  # fmt: skip
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
    from benchmarks.common import machine_info, progress
    from benchmarks.patterns.sections import run_timed, run_tokens
    from benchmarks.report import write_report

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
