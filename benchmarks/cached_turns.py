"""Cached-turn TTFT of an append-only agent conversation: kvreuse vs transformers reusing a DynamicCache.

Run from the repository root: ``python -m kvreuse.benchmarks.cached_turns [--quick] [--threads N]``.

The conversation (``kvreuse.benchmarks.ttft_multiturn.conversation_prompts``: a long system prompt, then turns of
``--min-new``..``--max-new`` new tokens) is replayed per dtype.  kvreuse: the radix engine serves each
turn's whole prompt (its cache holds the earlier turns); TTFT from the engine.  transformers: the
fastest prefix reuse it offers, a ``DynamicCache`` kept by hand across turns, fed only the tokens the
cache lacks, timed forward + argmax of the last row.  Both sides alternate turn by turn in one process;
the target is the median over cached turns (2..) of kvreuse / transformers <= 0.8.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time

import torch

from kvreuse.benchmarks.common import base_parser, bench_main, format_table, median, model_dir, progress
from kvreuse.benchmarks.ttft_multiturn import conversation_prompts

TARGET = 0.8


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run(args: argparse.Namespace) -> dict:
    from transformers import AutoModelForCausalLM, DynamicCache

    from kvreuse.runtime.engine.engine import Engine
    from kvreuse.runtime.sampling.params import SamplingParams

    params = SamplingParams(max_tokens=1, ignore_eos=True)
    out: dict = {"weights": "dense (dequantised GGUF)", "dtypes": args.dtypes, "per_dtype": {}}
    for dt in args.dtypes:
        dtype = getattr(torch, dt)
        eng = Engine(dtype=dt, quantize="none", kv_cache_memory="400M")
        hf = AutoModelForCausalLM.from_pretrained(model_dir(), dtype=dtype).eval()
        cache_arg = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
        prompts = conversation_prompts(eng.tokenizer, args.turns, args.seed, args.system_tokens,
                                       args.min_new, args.max_new)  # fmt: skip
        eng.generate([prompts[0][:32]], params)  # warm-up both sides
        with torch.inference_mode():
            hf(torch.tensor([prompts[0][:32]]), use_cache=True)
        cache, seen, rows = DynamicCache(), [], []
        for t, prompt in enumerate(prompts):
            o = eng.generate([prompt], params)[0]
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
            rows.append({"turn": t + 1, "prompt": len(prompt), "new_hf": len(prompt) - reuse,
                         "cached_kvreuse": o.cached_tokens, "ttft_kvreuse_s": o.ttft_s, "ttft_hf_s": hf_s,
                         "ratio": o.ttft_s / hf_s, "same_token": hf_tok == o.output_token_ids[0]})  # fmt: skip
            progress(f"{dt} turn {t + 1}: kvreuse {o.ttft_s:.3f} s, transformers {hf_s:.3f} s")
        cached = [r["ratio"] for r in rows[1:]]
        out["per_dtype"][dt] = {"turns": rows, "median_cached_ratio": median(cached),
                                "met": median(cached) <= TARGET}  # fmt: skip
        print(format_table(list(rows[0]), [tuple(r.values()) for r in rows]))
        print(f"{dt}: median cached-turn kvreuse/transformers = {median(cached):.2f} (target <= {TARGET})")
        del eng, hf, cache
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("cached_turns", __doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--system-tokens", type=int, default=1500)
    p.add_argument("--min-new", type=int, default=300)
    p.add_argument("--max-new", type=int, default=450)
    p.add_argument("--dtypes", default="float32,bfloat16")
    args = p.parse_args(argv)
    if args.quick:
        args.turns, args.system_tokens, args.min_new, args.max_new = 3, 100, 40, 60
    args.dtypes = args.dtypes.split(",")
    return args


def main(argv: list[str] | None = None) -> int:
    return bench_main("cached_turns", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
