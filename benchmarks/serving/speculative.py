"""Speculative decoding drafted from what the engine has already seen (issue 34): decode tokens/s with
``--speculative ngram`` / ``suffix`` against ``off``, on the four workloads of
``benchmarks/serving/speculative_workloads.py`` (replies scripted by forced decoding: see there), at batch 1
and 8, with the mean tokens each decode step emitted.

Run from the repository root: ``python -m kvreuse.benchmarks.serving.speculative [--quick] [--threads N] [--dtype D]``;
``--model`` takes another checkpoint, e.g. a hybrid's (``--model $(python -m kvreuse.benchmarks.serving.random_hybrid)``:
random Qwen3.5 weights with SmolLM2's tokenizer; the replies are scripted, so acceptance is the same).

Every round uses new variants of the workloads (other seeds) under a new tenant namespace, so neither
the prefix cache nor the ``suffix`` history holds the reply being timed; each round first runs the
prompts for one token (untimed: the prompt is then cached and, for ``suffix``, in the tenant's history,
as an agent's earlier turn would be), then times the replies.  Decode tokens/s = generated tokens /
wall time of the timed run (the prompts' last partial pages are all that is prefilled).  Engines of
the three modes are loaded side by side and the rounds interleave them (A B C A B C ...); ratios are
of medians in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import torch

from kvreuse.benchmarks.common import base_parser, bench_main, format_table, median, progress, reps
from kvreuse.benchmarks.serving.speculative_workloads import WORKLOADS, make
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.request import CacheScope
from kvreuse.runtime.sampling.params import SamplingParams

MODES = ("off", "ngram", "suffix")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("speculative", __doc__.splitlines()[0])
    p.add_argument(
        "--dtype", default=None, help="model dtype (default: this CPU's, bf16 with AVX512-BF16 else fp32)"
    )
    p.add_argument("--model", default=None, help="model (default: the embedded SmolLM2-135M)")
    p.add_argument(
        "--quantize",
        default="none",
        help="weights: none (dense) or gguf (the GGUF's own blocks, as llama.cpp)",
    )
    p.add_argument("--batches", default="1,8", help="batch sizes (default 1,8)")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--max-reply", type=int, default=None, help="cap on reply tokens (default 400, quick 120)")
    p.add_argument(
        "--llamacpp-python", default=None, help="interpreter with numpy + cffi for llama.cpp's side"
    )
    p.add_argument(
        "--llamacpp-module", default=None, help="directory of llama-cpp-cffi's _llama_cpp_cpu module"
    )
    p.add_argument("--llamacpp-preload", default=None, help="LD_PRELOAD for it (benchmarks/README.md)")
    p.add_argument(
        "--gguf", type=Path, default=None, help="GGUF for llama.cpp (default: the embedded model's)"
    )
    return p.parse_args(argv)


def chat_ids(eng: Engine, messages: list[dict]) -> list[int]:
    ids = eng.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def run_batch(eng: Engine, prompts: list[list[int]], params: list[SamplingParams], ns: str) -> list:
    reqs = [eng.make_request(p, sp, scope=CacheScope(ns)) for p, sp in zip(prompts, params)]
    for r in reqs:
        eng.submit(r)
    while any(r.finish_reason is None for r in reqs):
        eng.step()
    return reqs


def one_round(eng: Engine, workload: str, batch: int, rnd: int, max_reply: int) -> dict:
    """Warm the prompts (one token each), then time the forced replies; returns figures of the batch."""
    items = [make(workload, 1000 * rnd + i) for i in range(batch)]
    prompts = [chat_ids(eng, w.messages) for w in items]
    replies = [eng.tokenizer.encode(w.reply, add_special_tokens=False)[:max_reply] for w in items]
    ns = f"{workload}-{batch}-{rnd}"
    run_batch(eng, prompts, [SamplingParams(max_tokens=1)] * batch, ns)
    params = [SamplingParams(max_tokens=len(r), forced_tokens=r, ignore_eos=True) for r in replies]
    t0 = time.perf_counter()
    reqs = run_batch(eng, prompts, params, ns)
    dt = time.perf_counter() - t0
    assert all(r.output_ids == rep for r, rep in zip(reqs, replies)), "a reply differs from its script"
    gen = sum(len(r.output_ids) for r in reqs)
    acc = sum(r.accepted_tokens for r in reqs)
    return dict(seconds=dt, tokens=gen, accepted=acc, drafted=sum(r.drafted_tokens for r in reqs),
                prompt_tokens=sum(map(len, prompts)) // batch)  # fmt: skip


def llamacpp(args: argparse.Namespace, eng: Engine, workload: str, n: int, max_reply: int) -> dict | None:
    """llama.cpp on the same GGUF, prompts and scripted replies, batch 1: plain decode and prompt lookup
    (``benchmarks/peers/llamacpp_lookup_side.py``); medians over the rounds' variants."""
    if not args.llamacpp_python:
        return None
    items = [make(workload, 1000 * rnd) for rnd in range(n)]
    prompts = [chat_ids(eng, w.messages) for w in items]
    replies = [eng.tokenizer.encode(w.reply, add_special_tokens=False)[:max_reply] for w in items]
    gguf = (
        args.gguf
        or next(Path(eng.model_dir).parent.glob("*.gguf"), None)
        or next((Path.home() / ".cache/kvreuse/embedded").glob("*.gguf"))
    )
    job = dict(
        gguf=str(gguf), threads=torch.get_num_threads(), prompts=prompts, replies=replies, ngram=2, k=10
    )
    env = dict(os.environ, LD_PRELOAD=args.llamacpp_preload) if args.llamacpp_preload else None
    side = Path(__file__).resolve().parents[1] / "peers" / "llamacpp_lookup_side.py"
    r = subprocess.run([args.llamacpp_python, str(side), args.llamacpp_module], input=json.dumps(job),
                       capture_output=True, text=True, env=env, check=True)  # fmt: skip
    res = json.loads(r.stdout)["results"]
    tps = {m: median([x[m]["tokens"] / x[m]["decode_s"] for x in res]) for m in ("off", "lookup")}
    tok = sum(x["lookup"]["tokens"] for x in res)
    steps = sum(x["lookup"]["steps"] for x in res)
    return dict(gguf=gguf.name, decode_tok_s=tps, lookup_vs_off=tps["lookup"] / tps["off"],
                lookup_tokens_per_step=tok / steps, runs=res)  # fmt: skip


def run(args: argparse.Namespace) -> dict:
    n = reps(args, 3)
    max_reply = args.max_reply or (120 if args.quick else 400)
    engines = {m: Engine(args.model, dtype=args.dtype, speculative=m, kv_cache_memory="1G", max_running=8,
                         quantize=args.quantize) for m in MODES}  # fmt: skip
    args.dtype = str(engines["off"].dtype).removeprefix("torch.")
    results, rows = [], []
    for wl in args.workloads.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            runs: dict[str, list[dict]] = {m: [] for m in MODES}
            for rnd in range(n):
                for m, eng in engines.items():
                    runs[m].append(one_round(eng, wl, batch, rnd, max_reply))
                    r = runs[m][-1]
                    progress(
                        f"{wl} b{batch} {m} round {rnd}: {r['tokens'] / r['seconds']:.1f} tok/s, "
                        f"{r['accepted']} of {r['drafted']} drafted accepted, {r['tokens']} tokens"
                    )
            tps = {m: median([r["tokens"] / r["seconds"] for r in rs]) for m, rs in runs.items()}
            entry = dict(workload=wl, batch=batch, decode_tok_s=tps, runs=runs)
            for m in MODES[1:]:
                tok = sum(r["tokens"] for r in runs[m])
                acc = sum(r["accepted"] for r in runs[m])
                entry[f"{m}_vs_off"] = tps[m] / tps["off"]
                entry[f"{m}_tokens_per_step"] = tok / (tok - acc)
                entry[f"{m}_accepted_per_step"] = acc / (tok - acc)
                entry[f"{m}_acceptance"] = acc / max(1, sum(r["drafted"] for r in runs[m]))
            if batch == 1:
                entry["llamacpp"] = lc = llamacpp(args, engines["off"], wl, n, max_reply)
                if lc is not None:
                    progress(f"{wl} llama.cpp: {lc['decode_tok_s']}")
            results.append(entry)
            rows.append([wl, batch, tps["off"], tps["ngram"], entry["ngram_vs_off"], entry["ngram_tokens_per_step"],
                         tps["suffix"], entry["suffix_vs_off"], entry["suffix_tokens_per_step"]])  # fmt: skip
    table = format_table(
        ["workload", "batch", "off tok/s", "ngram tok/s", "ngram / off", "ngram tok/step", "suffix tok/s",
         "suffix / off", "suffix tok/step"],
        rows,
    )  # fmt: skip
    print(
        f"dtype {args.dtype}, weights {args.quantize}, threads {__import__('torch').get_num_threads()}, "
        f"max reply {max_reply} tokens\n"
    )
    lc_rows = [[e["workload"], e["llamacpp"]["decode_tok_s"]["off"], e["llamacpp"]["decode_tok_s"]["lookup"],
                e["llamacpp"]["lookup_vs_off"], e["llamacpp"]["lookup_tokens_per_step"], e["ngram_vs_off"]]
               for e in results if e.get("llamacpp")]  # fmt: skip
    if lc_rows:
        table += (
            "\n\nllama.cpp (same GGUF, prompts, scripted replies; batch 1; threads as ours):\n"
            + format_table(
                [
                    "workload",
                    "llama.cpp off tok/s",
                    "lookup tok/s",
                    "lookup / off",
                    "lookup tok/step",
                    "ours ngram / off",
                ],
                lc_rows,
            )
        )
    print(table)
    scripted = "every reply forced (SamplingParams.forced_tokens): the 135M model would not write them"
    return dict(model=engines["off"].model_name, dtype=args.dtype, quantize=args.quantize, max_reply=max_reply,
                scripted=scripted,
                results=results, table=table)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    return bench_main("speculative", parse_args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
