"""The benchmark's two kinds of section: token-exact jobs on the tiny real-vocabulary models (grouped by
tokenizer family, one engine each) and timed jobs in interleaved rounds plus the TTFT-vs-context curve."""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks.patterns import PATTERNS
from benchmarks.patterns.plan import Job
from benchmarks.patterns.stacks import STACKS
from benchmarks.targets import AccountingTarget, InProcessTarget, ServerTarget
from benchmarks.workloads import load

# Workloads whose token-exact jobs use the engine's reuse rule (AccountingTarget) instead of the engine:
# the agent session's 65 requests force ~6K reply tokens and prefill ~2M tokens per full-recompute pattern.
ACCOUNTED = {"agent"}


def engine_for(family: str | None, args: argparse.Namespace) -> Any:
    """The in-process engine of a stack: the tiny real-vocabulary model, or ``--model`` (embedded)."""
    from runtime.engine.engine import Engine

    if family is None:
        tiers = {k: getattr(args, k, None) for k in ("kv_cache_memory", "kv_host_memory", "kv_store")}
        return Engine(
            args.model, page_size=args.page_size, snapshot_every=getattr(args, "snapshot_every", 0),
            **{k: v for k, v in tiers.items() if v is not None},
        )  # fmt: skip
    from benchmarks.real_vocab import tiny_model_dir

    # one long chunk: a 1-layer model's step cost is mostly per-step overhead
    return Engine(
        model_dir=str(tiny_model_dir(family)), dtype="float32", page_size=args.page_size, chunk_size=8192
    )


def run_tokens(jobs: list[Job], args: argparse.Namespace, log: Any) -> list[dict]:
    """The token-exact jobs, grouped by tokenizer family so each tiny model loads once."""
    from benchmarks.pattern_runner import run_pattern

    runs: list[dict] = []
    by_family: dict[str | None, list[Job]] = {}
    for j in jobs:
        by_family.setdefault(STACKS[j.stack].family, []).append(j)
    pieces: dict[Any, Any] = {}
    for family, fjobs in by_family.items():
        engine = None
        for j in fjobs:
            t0 = time.perf_counter()
            traj, stack = load(j.workload, j.variant), STACKS[j.stack]
            if j.workload in ACCOUNTED:  # too long to replay through a model on a CPU: the engine's rule
                from benchmarks.real_vocab import load_tokenizer

                tokenizer = load_tokenizer(family)
                target: Any = AccountingTarget(tokenizer, args.page_size)
            else:
                engine = engine or engine_for(family, args)
                tokenizer, target = engine.tokenizer, InProcessTarget(engine, max_tokens=2)
            pre = None
            if isinstance(target, AccountingTarget):  # no segments needed: memoised piece tokenisation
                from benchmarks.pattern_runner import render_all
                from benchmarks.patterns.stacks import PieceTokenizer

                fast = pieces.setdefault(family, PieceTokenizer(tokenizer))
                pre = render_all(tokenizer, PATTERNS[j.pattern], traj, stack, j.replies, fast)
            runs.append(run_pattern(target, tokenizer, PATTERNS[j.pattern], traj, lambda row: None,
                                    args.page_size, pre, stack, j.replies))  # fmt: skip
            runs[-1]["target"] = target.name
            t = runs[-1]["totals"]
            log(f"{j.workload}:{j.stack}:{j.pattern}:{j.replies} prefilled {t['prefilled_tokens']:,} of "
                f"{t['prompt_tokens']:,} ({time.perf_counter() - t0:.1f}s)")  # fmt: skip
        del engine
    return runs


def run_timed(jobs: list[Job], args: argparse.Namespace, log: Any) -> tuple[list[dict], list[dict], dict]:
    """Interleaved rounds of the timed jobs, then the TTFT-vs-context curve (in-process only)."""
    import transformers

    from benchmarks.pattern_runner import render_all, run_pattern
    from benchmarks.patterns.ttft import context_curve, rotated, summarize_rounds
    from runtime.loading.model_source import resolve_model

    rounds_n = args.rounds or (1 if args.quick else 3)
    if args.server:
        target = ServerTarget(args.server, args.served_model, max_tokens=args.max_tokens)
        tokenizer = transformers.AutoTokenizer.from_pretrained(resolve_model(args.model)[0])
        meta = {"target": "server", "url": args.server, "model": target.model}
        engine = None
    else:
        engine = engine_for(None, args)
        target, tokenizer = InProcessTarget(engine, max_tokens=args.max_tokens), engine.tokenizer
        meta = {"target": "in-process", "model": engine.model_name, "dtype": str(engine.dtype),
                "device": str(engine.device)}  # fmt: skip
    prepared = {j: render_all(tokenizer, PATTERNS[j.pattern], load(j.workload, j.variant), STACKS[j.stack],
                              j.replies) for j in jobs}  # fmt: skip
    if engine is not None:  # warm-up: the first forward pays for allocation and kernel selection
        engine.generate([list(range(100, 400))], engine_params(1))
    rounds = []
    for r in range(rounds_n):
        runs = []
        for j in rotated(jobs, r):
            traj = load(j.workload, j.variant)
            runs.append(run_pattern(target, tokenizer, PATTERNS[j.pattern], traj, lambda row: None,
                                    args.page_size, prepared[j], STACKS[j.stack], j.replies))  # fmt: skip
            log(f"round {r} {j.pattern}: TTFT {sum(x['ttft_s'] for x in runs[-1]['requests']):.1f}s")
        rounds.append(runs)
    order = [j.pattern for j in jobs]
    merged = sorted(summarize_rounds(rounds), key=lambda run: order.index(run["pattern"]))
    for run in merged:
        run["rounds"] = rounds_n
    lengths = (
        [int(x) for x in args.curve.split(",")]
        if args.curve
        else [512, 1024, 2048]
        if args.quick
        else [512, 1024, 2048, 4096]
    )
    curve = context_curve(engine, lengths, rounds_n, log) if engine is not None else []
    return merged, curve, meta


def engine_params(n: int) -> Any:
    from runtime.sampling.params import SamplingParams

    return SamplingParams(max_tokens=n)
