"""The benchmark's two kinds of section: token-exact jobs on the tiny real-vocabulary models (grouped by
tokenizer family, one engine each) and timed jobs in interleaved rounds plus the TTFT-vs-context curve."""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from kvreuse.benchmarks.patterns import PATTERNS
from kvreuse.benchmarks.patterns.plan import Job
from kvreuse.benchmarks.patterns.stacks import STACKS
from kvreuse.benchmarks.patterns.targets import AccountingTarget, InProcessTarget, ServerTarget
from kvreuse.benchmarks.workloads import load


def engine_for(
    family: str | None, args: argparse.Namespace, prefix_cache: str = "radix", page: int = 0
) -> Any:
    """The in-process engine of a stack: the tiny real-vocabulary model, or ``--model`` (embedded)."""
    from kvreuse.runtime.engine.engine import Engine

    page = page or args.page_size
    if family is None:
        tiers = {k: getattr(args, k, None) for k in ("kv_cache_memory", "kv_host_memory", "kv_store")}
        return Engine(
            args.model, page_size=page, snapshot_every=getattr(args, "snapshot_every", 0),
            prefix_cache=prefix_cache, **{k: v for k, v in tiers.items() if v is not None},
        )  # fmt: skip
    from kvreuse.benchmarks.real_vocab import tiny_model_dir

    # one chunk for any prompt (the agent session's reach ~50K tokens): a 1-layer model's step cost is
    # mostly per-step overhead and attention, and one causal call over a whole prompt skips the masked
    # part that chunks over a cached prefix compute;
    # 64 bytes of KV a token, so 256 MiB holds 4M tokens (the agent session computes ~0.3M distinct ones)
    return Engine(
        model_dir=str(tiny_model_dir(family)), dtype="float32", page_size=page, chunk_size=65536,
        prefix_cache=prefix_cache, kv_cache_memory="256M",
    )  # fmt: skip


def run_tokens(jobs: list[Job], args: argparse.Namespace, log: Any) -> list[dict]:
    """The token-exact jobs; the accounted ones (the agent session: tokenisation, no model) in a second
    process beside the engine's, which run on one torch thread: on two cores they cost no wall time."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    side = [j for j in jobs if j.workload in accounted(args)]
    rest = [j for j in jobs if j.workload not in accounted(args)]
    if not side or not rest:
        return run_group(jobs, args, log)
    from kvreuse.benchmarks.common import progress

    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        later = pool.submit(run_group, side, args, progress)
        runs = run_group(rest, args, log)
        return runs + later.result()


def run_group(jobs: list[Job], args: argparse.Namespace, log: Any) -> list[dict]:
    """The token-exact jobs, grouped by engine (tokenizer family, prefix cache, page size) so each tiny
    model loads once per setting; ``log`` gets one line per job (progress in a non-TTY log)."""
    from kvreuse.benchmarks.patterns.run import run_pattern

    runs: list[dict] = []
    groups: dict[tuple, list[Job]] = {}
    for j in jobs:
        groups.setdefault((STACKS[j.stack].family, j.prefix_cache, j.page), []).append(j)
    pieces: dict[Any, Any] = {}
    done, total = 0, len(jobs)
    threads = torch.get_num_threads()
    on: dict[Job, dict] = {}
    for (family, prefix_cache, page), gjobs in groups.items():
        engine = None
        # the tiny models' ops are microseconds of work each: a second intra-op thread only adds a barrier
        # per op, and one that waits for a descheduled thread whenever anything else runs on the machine
        torch.set_num_threads(1 if family is not None else threads)
        for j in gjobs:
            t0 = time.perf_counter()
            twin = on.get(j._replace(prefix_cache="radix"))
            if prefix_cache == "off" and j.workload in DERIVED_OFF and twin is not None:
                runs.append(cache_off(twin))
                done += 1
                log(f"[{done}/{total}] {j.workload}:{j.variant}:{j.stack}:{j.pattern}:{j.replies} cache off "
                    f"(every prompt token of the cache-on run prefilled) {runs[-1]['totals']['prefilled_tokens']:,}")  # fmt: skip
                continue
            traj, stack = PATTERNS[j.pattern].prepare(load(j.workload, j.variant)), STACKS[j.stack]
            page_size = j.page or args.page_size
            if j.workload in accounted(args):  # the engine's rule, for a quick look at agent scale
                from kvreuse.benchmarks.patterns.stacks import PieceTokenizer
                from kvreuse.benchmarks.real_vocab import load_tokenizer

                # one tokenizer per family (loading one takes seconds: as long as a cheap pattern's whole run)
                if family not in pieces:
                    pieces[family] = PieceTokenizer(load_tokenizer(family))
                tokenizer = pieces[family].tokenizer
                target: Any = AccountingTarget(tokenizer, page_size)
            else:
                engine = engine or engine_for(family, args, prefix_cache, page)
                tokenizer, target = (
                    engine.tokenizer,
                    InProcessTarget(engine, max_tokens=2, reply_kv=j.reply_kv),
                )
            pre = None
            if isinstance(target, AccountingTarget) or j.workload == "agent":  # memoised piece tokenisation:
                # 65 prompts of up to ~50K tokens; segments (which message a divergence falls in) are skipped
                from kvreuse.benchmarks.patterns.run import render_all
                from kvreuse.benchmarks.patterns.stacks import PieceTokenizer

                fast = pieces.setdefault(family, PieceTokenizer(tokenizer))
                pre = render_all(tokenizer, PATTERNS[j.pattern], traj, stack, j.replies, fast)
            runs.append(run_pattern(target, tokenizer, PATTERNS[j.pattern], traj, lambda row: None,
                                    page_size, pre, stack, j.replies))  # fmt: skip
            runs[-1].update(target=target.name, prefix_cache=prefix_cache, page_size=page_size,
                            reply_kv=j.reply_kv, segments=pre is None)  # fmt: skip
            on[j] = runs[-1]
            t = runs[-1]["totals"]
            done += 1
            log(f"[{done}/{total}] {j.workload}:{j.variant}:{j.stack}:{j.pattern}:{j.replies}"
                f"{'' if prefix_cache == 'radix' else ' cache off'}{f' page {page}' if page else ''} prefilled "
                f"{t['prefilled_tokens']:,} of {t['prompt_tokens']:,} ({time.perf_counter() - t0:.1f}s)")  # fmt: skip
        del engine
    torch.set_num_threads(threads)
    return runs


# Workloads whose cache-off runs are derived from their cache-on runs (the same requests, every prompt token
# prefilled: what an engine with prefix_cache="off" does, tests/test_verdict_integrity.py checks it on the
# engine's own cache-off runs) instead of prefilling ~2M tokens per pattern again.
DERIVED_OFF = ("agent",)


def cache_off(run: dict) -> dict:
    """The cache-off twin of a cache-on run: the same requests and replies, nothing reused."""
    from kvreuse.benchmarks.patterns.run import totals

    rows = [{**x, "cached_tokens": 0, "prefilled_tokens": x["prompt_tokens"]} for x in run["requests"]]
    return {**run, "requests": rows, "totals": totals(rows), "prefix_cache": "off",
            "target": f"{run.get('target', 'in-process')}, cache off (derived: every prompt token prefilled)"}  # fmt: skip


def accounted(args: argparse.Namespace) -> set[str]:
    """Workloads run through the engine's reuse rule (AccountingTarget) instead of the engine: the agent
    session (65 requests up to ~52K tokens) unless ``--full`` runs it through the engine (minutes per
    pattern); ``--accounting`` keeps the rule with ``--full``."""
    full = getattr(args, "full", False) and not getattr(args, "accounting", False)
    return set() if full else {"agent"}


def run_timed(jobs: list[Job], args: argparse.Namespace, log: Any) -> tuple[list[dict], list[dict], dict]:
    """Interleaved rounds of the timed jobs, then the TTFT-vs-context curve (in-process only)."""
    import transformers

    from kvreuse.benchmarks.patterns.run import render_all, run_pattern
    from kvreuse.benchmarks.patterns.ttft import context_curve, rotated, summarize_rounds
    from kvreuse.runtime.loading.model_source import resolve_model

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
    prepared = {j: render_all(tokenizer, PATTERNS[j.pattern], PATTERNS[j.pattern].prepare(load(j.workload, j.variant)),
                              STACKS[j.stack], j.replies) for j in jobs}  # fmt: skip
    if engine is not None:  # warm-up: the first forward pays for allocation and kernel selection
        engine.generate([list(range(100, 400))], engine_params(1))
    rounds = []
    for r in range(rounds_n):
        runs = []
        for j in rotated(jobs, r):
            traj = PATTERNS[j.pattern].prepare(load(j.workload, j.variant))
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
    from kvreuse.runtime.sampling.params import SamplingParams

    return SamplingParams(max_tokens=n)
