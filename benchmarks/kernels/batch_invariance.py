"""Does greedy output depend on what a request is batched with?  fp32 vs bf16, measured side by side.

For each dtype: N prompts decoded greedily together (one batch), then each alone on a fresh cache;
count the prompts whose tokens are identical, and time both.  ``python -m kvreuse.benchmarks.kernels.batch_invariance
[--prompts 8] [--tokens 24] [--out benchmarks/results/batch_invariance.json]``.  Embedded model, CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.sampling.params import SamplingParams

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "List three prime numbers:",
    "The quick brown fox",
    "Explain photosynthesis in one sentence.",
    "Translate 'good morning' into Spanish:",
    "Once upon a time, in a small village,",
    "The three laws of motion are",
    "SELECT name FROM users WHERE",
    "A recipe for pancakes needs",
    "The meaning of life is",
    "In 1969, astronauts",
    "import numpy as np\n",
    "My favourite colour is",
    "The best way to learn a language is",
]


def measure(dtype: str, n: int, tokens: int) -> dict:
    eng = Engine(None, dtype=dtype, kv_cache_memory="256M")
    chat = [
        eng.tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
        )
        for p in PROMPTS[:n]
    ]
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    batched = [o.output_token_ids for o in eng.generate(chat, params)]
    t_batch = time.perf_counter() - t0
    alone, t_alone = [], 0.0
    for p in chat:
        eng.reset_prefix_cache()
        t0 = time.perf_counter()
        alone.append(eng.generate(p, params)[0].output_token_ids)
        t_alone += time.perf_counter() - t0
    same = sum(a == b for a, b in zip(batched, alone))
    return {
        "dtype": dtype,
        "identical": same,
        "of": n,
        "batch_s": round(t_batch, 2),
        "alone_s": round(t_alone, 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rows = []
    for d in ("float32", "bfloat16"):
        rows.append(measure(d, args.prompts, args.tokens))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    f32, b16 = rows
    result = {
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "prompts": args.prompts,
        "tokens": args.tokens,
        "rows": rows,
        "fp32_over_bf16_time_batched": round(f32["batch_s"] / b16["batch_s"], 3),
    }
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
