"""Cached-turn TTFT of an append-only agent conversation: kvreuse vs transformers reusing a DynamicCache.

Run from the repository root: ``python -m kvreuse.benchmarks.serving.cached_turns [--quick] [--threads N]``;
``--agent`` is the issue-54 workload (8 requests growing 1.6K -> 3.6K tokens, results in
``results/cached_turns_agent.json``).

The conversation (``kvreuse.benchmarks.serving.ttft_multiturn.conversation_prompts``: a long system prompt, then turns of
``--min-new``..``--max-new`` new tokens) is replayed per dtype.  kvreuse: the radix engine serves each
turn's whole prompt (its cache holds the earlier turns); TTFT from the engine.  transformers: the
fastest prefix reuse it offers, a ``DynamicCache`` kept by hand across turns, fed only the tokens the
cache lacks, timed forward + argmax of the last row.  Both sides alternate turn by turn in one process;
the target is the median over cached turns (2..) of kvreuse / transformers <= 0.8.

Each turn is also put against the machine: its forward FLOPs (``kvreuse.benchmarks.kernels.extend.flops``: the
linears and the attention pairs each side's causal mask keeps, counted for the tokens that side
actually computed) over its TTFT, as a share of the **matmul ceiling** of that dtype, the best rate of
``torch.matmul`` on linear-layer shapes measured in the same process before and after the dtype's
turns.  ``--before`` adds a second kvreuse engine as it was before issue 54 (``before_engine``), alternating
turn by turn with the others.
``--check-tokens N`` compares N greedy tokens a turn with transformers' (untimed).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import sys
import time

import torch

from kvreuse.benchmarks.common import (
    RESULTS_DIR,
    base_parser,
    bench_main,
    format_table,
    median,
    model_dir,
    progress,
)
from kvreuse.benchmarks.kernels.extend import flops
from kvreuse.benchmarks.serving.ttft_multiturn import conversation_prompts

TARGET = 0.8
# (turns, system tokens, min new, max new): the issue-54 agent workload (``--agent``) and ``--quick``'s
AGENT_WORKLOAD = (8, 1250, 250, 330)
QUICK_WORKLOAD = (3, 100, 40, 60)
# [rows, k] @ [k, n]: the model's linears at a turn's row count, and a square GEMM
CEILING_SHAPES = [(512, 576, 1536), (512, 1536, 576), (1024, 1024, 1024)]


def matmul_ceiling(dtype: torch.dtype, reps: int = 5) -> float:
    """The best ``torch.matmul`` rate (FLOP/s) of ``CEILING_SHAPES`` in ``dtype``."""
    best = 0.0
    for m, k, n in CEILING_SHAPES:
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        torch.matmul(a, b)
        for _ in range(reps):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            best = max(best, 2 * m * k * n / (time.perf_counter() - t0))
    return best


def before_engine(dt: str):
    """kvreuse as it was before issue 54: extends on the torch layers (the fused CPU kernels for decode
    only) and, in fp32, on the torch reference's attention (no fp32 flash kernel)."""
    from kvreuse.kernels import reference
    from kvreuse.runtime.engine.engine import Engine

    eng = Engine(dtype=dt, quantize="none", kv_cache_memory="400M")
    model = eng.runner.model
    if model.decode_run is not None:  # a wrapper, not the fused layer itself: extends take the torch layers
        fn, plans = model.decode_run
        model.decode_run = (functools.partial(fn), plans)
    if dt == "float32":
        eng.runner.backend = eng.runner.backend._replace(extend_attention=reference.extend_attention)
    return eng


def greedy_hf(hf, cache, cache_arg: str, first: int, n: int) -> list[int]:
    """``n`` greedy tokens from transformers after a prompt whose first token was ``first`` (untimed)."""
    toks = [first]
    with torch.inference_mode():
        for _ in range(n - 1):
            res = hf(torch.tensor([[toks[-1]]]), use_cache=True, logits_to_keep=1, **{cache_arg: cache})
            toks.append(int(res.logits[0, -1].argmax()))
    return toks


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run(args: argparse.Namespace) -> dict:
    from transformers import AutoModelForCausalLM, DynamicCache

    from kvreuse.runtime.engine.engine import Engine
    from kvreuse.runtime.sampling.params import SamplingParams

    params = SamplingParams(max_tokens=args.check_tokens, ignore_eos=True)
    out: dict = {"weights": "dense (dequantised GGUF)", "dtypes": args.dtypes, "per_dtype": {}}
    for dt in args.dtypes:
        dtype = getattr(torch, dt)
        eng = Engine(dtype=dt, quantize="none", kv_cache_memory="400M")
        engines = {"kvreuse": eng}
        if args.before:
            engines["before"] = before_engine(dt)
        cfg = eng.model_config
        hf = AutoModelForCausalLM.from_pretrained(model_dir(), dtype=dtype).eval()
        cache_arg = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
        prompts = conversation_prompts(eng.tokenizer, args.turns, args.seed, args.system_tokens,
                                       args.min_new, args.max_new)  # fmt: skip
        for e in engines.values():  # warm-up every side
            e.generate([prompts[0][:32]], params)
        with torch.inference_mode():
            hf(torch.tensor([prompts[0][:32]]), use_cache=True)
        ceiling = [matmul_ceiling(dtype)]
        cache, seen, rows = DynamicCache(), [], []
        for t, prompt in enumerate(prompts):
            outs = {name: e.generate([prompt], params)[0] for name, e in engines.items()}
            o = outs["kvreuse"]
            reuse = common_prefix(seen, prompt)
            assert reuse == len(seen), "the conversation is append-only"
            with torch.inference_mode():
                t0 = time.perf_counter()
                res = hf(
                    torch.tensor([prompt[reuse:]]), use_cache=True, logits_to_keep=1, **{cache_arg: cache}
                )
                hf_tok = int(res.logits[0, -1].argmax())
                hf_s = time.perf_counter() - t0
            cache, seen = res.past_key_values, list(prompt)
            hf_toks = greedy_hf(hf, cache, cache_arg, hf_tok, args.check_tokens)
            if args.check_tokens > 1:  # the next turn's prompt goes on from the prompt, not the reply
                cache.crop(1 - args.check_tokens)  # transformers 5: a negative count of tokens to drop
            row = {"turn": t + 1, "prompt": len(prompt), "new_hf": len(prompt) - reuse,
                   "cached_kvreuse": o.cached_tokens, "ttft_kvreuse_s": o.ttft_s, "ttft_hf_s": hf_s,
                   "ratio": o.ttft_s / hf_s, "same_tokens": hf_toks == o.output_token_ids,
                   "gflop_kvreuse": flops(cfg, len(prompt) - o.cached_tokens, o.cached_tokens) / 1e9,
                   "gflop_hf": flops(cfg, len(prompt) - reuse, reuse) / 1e9}  # fmt: skip
            if "before" in outs:
                row["ttft_before_s"] = outs["before"].ttft_s
                row["ratio_before"] = outs["before"].ttft_s / hf_s
            rows.append(row)
            progress(f"{dt} turn {t + 1}: kvreuse {o.ttft_s:.3f} s, transformers {hf_s:.3f} s")
        ceiling.append(matmul_ceiling(dtype))
        top = max(ceiling)
        for r in rows:
            r["pct_ceiling_kvreuse"] = 100 * r["gflop_kvreuse"] * 1e9 / r["ttft_kvreuse_s"] / top
            r["pct_ceiling_hf"] = 100 * r["gflop_hf"] * 1e9 / r["ttft_hf_s"] / top
        cached = rows[1:]
        summary = {
            "median_cached_ratio": median([r["ratio"] for r in cached]),
            "matmul_ceiling_gflops": [c / 1e9 for c in ceiling],
            "median_cached_pct_ceiling_kvreuse": median([r["pct_ceiling_kvreuse"] for r in cached]),
            "median_cached_pct_ceiling_hf": median([r["pct_ceiling_hf"] for r in cached]),
            "median_cached_ttft_kvreuse_s": median([r["ttft_kvreuse_s"] for r in cached]),
            "median_cached_ttft_hf_s": median([r["ttft_hf_s"] for r in cached]),
            "turns_same_tokens": sum(r["same_tokens"] for r in rows),
        }
        if "before" in engines:
            summary["median_cached_ratio_before"] = median([r["ratio_before"] for r in cached])
        summary["met"] = summary["median_cached_ratio"] <= TARGET
        out["per_dtype"][dt] = {"turns": rows, **summary}
        print(format_table(list(rows[0]), [tuple(r.values()) for r in rows]))
        print(f"{dt}: median cached-turn kvreuse/transformers = {summary['median_cached_ratio']:.2f} "
              f"(target <= {TARGET}); {summary['median_cached_pct_ceiling_kvreuse']:.0f}% of the "
              f"{top / 1e9:.0f} GFLOP/s matmul ceiling (transformers "
              f"{summary['median_cached_pct_ceiling_hf']:.0f}%); greedy {summary['turns_same_tokens']}/"
              f"{len(rows)} turns equal")  # fmt: skip
        del eng, engines, hf, cache
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("cached_turns", __doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--system-tokens", type=int, default=1500)
    p.add_argument("--min-new", type=int, default=300)
    p.add_argument("--max-new", type=int, default=450)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--agent", action="store_true", help="8 requests growing 1.6K -> 3.6K tokens")
    p.add_argument("--before", action="store_true", help="also kvreuse as before issue 54 (before_engine)")
    p.add_argument("--check-tokens", type=int, default=1, help="greedy tokens a turn compared")
    args = p.parse_args(argv)
    if args.agent:
        args.turns, args.system_tokens, args.min_new, args.max_new = AGENT_WORKLOAD
        if args.out == RESULTS_DIR / "cached_turns.json":
            args.out = RESULTS_DIR / "cached_turns_agent.json"
    if args.quick:
        args.turns, args.system_tokens, args.min_new, args.max_new = QUICK_WORKLOAD
    args.dtypes = args.dtypes.split(",")
    return args


def main(argv: list[str] | None = None) -> int:
    return bench_main("cached_turns", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
