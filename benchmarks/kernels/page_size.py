"""Pick the default KV page size from measurement: granularity loss, decode and prefill speed per page size.

Run from the repository root: ``python -m kvreuse.benchmarks.kernels.page_size [--quick] [--out PATH] [--threads N]``.

For each page size (1, 4, 16, 32, 64) an engine with the radix cache replays the 10-turn agent conversation
of ``kvreuse.benchmarks.serving.ttft_multiturn`` (one generated token a turn), then decodes ``--decode-tokens`` tokens after
its last prompt.  Measured per page size:

* prefill tokens lost to page granularity: tokens prefilled minus the ideal (per turn, the tokens no earlier
  request contained, at least one so there are logits), summed over the conversation;
* prefill tokens/s over the conversation (tokens prefilled / summed admission-to-first-token time);
* decode tokens/s at the conversation's final depth (one stream);
* summed TTFT of all turns (what an agent waits).

All engines live in one process and rounds interleave the page sizes; figures are medians over rounds.
"""

from __future__ import annotations

import argparse
import sys

from kvreuse.benchmarks.common import (
    base_parser,
    bench_main,
    format_table,
    median,
    progress,
    reps,
)
from kvreuse.benchmarks.serving.ttft_multiturn import conversation_prompts
from kvreuse.chat_templates.render import first_divergence


def ideal_prefill(prompts: list[list[int]], outputs: list[list[int]]) -> list[int]:
    """Per turn: tokens no earlier request (prompt + its output) shares as a prefix, but at least one."""
    seen: list[list[int]] = []
    ideal = []
    for prompt, out in zip(prompts, outputs):
        hit = max((first_divergence(s, prompt) for s in seen), default=0)
        ideal.append(max(1, len(prompt) - hit))
        seen.append(prompt + out)
    return ideal


def replay(engine, prompts: list[list[int]], decode_tokens: int) -> dict:
    from kvreuse.runtime.sampling.params import SamplingParams

    engine.reset_prefix_cache()
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    outs = [engine.generate([p], one)[0] for p in prompts]
    ideal = ideal_prefill(prompts, [o.output_token_ids for o in outs])
    prefilled = [o.prefilled_tokens for o in outs]
    dec = engine.generate([prompts[-1]], SamplingParams(max_tokens=decode_tokens, ignore_eos=True))[0]
    engine.cache.check_integrity()
    return {
        "prefilled": sum(prefilled),
        "ideal": sum(ideal),
        "lost": sum(prefilled) - sum(ideal),
        "prefill_tok_s": sum(prefilled) / sum(o.prefill_s for o in outs),
        "ttft_sum_s": sum(o.ttft_s for o in outs),
        "decode_tok_s": (decode_tokens - 1) / dec.decode_s,
        "first_tokens": [o.output_token_ids[0] for o in outs],
    }


def run(args: argparse.Namespace) -> dict:
    from kvreuse.runtime.engine.engine import Engine

    sizes = [int(x) for x in args.page_sizes.split(",")]
    engines = {ps: Engine(dtype="float32", prefix_cache="radix", page_size=ps, kv_cache_memory=args.kv_cache_memory)
               for ps in sizes}  # fmt: skip
    prompts = conversation_prompts(engines[sizes[0]].tokenizer, args.turns, args.seed, args.system_tokens,
                                   args.min_new, args.max_new)  # fmt: skip
    n_reps = reps(args)
    samples: dict[int, list[dict]] = {ps: [] for ps in sizes}
    for ps in sizes:  # warm-up: first calls pay for allocation and kernel selection
        replay(engines[ps], prompts[:1], 4)
    for r in range(n_reps):
        for ps in sizes:
            samples[ps].append(replay(engines[ps], prompts, args.decode_tokens))
            progress(f"round {r} page size {ps}: {samples[ps][-1]['ttft_sum_s']:.2f} s summed TTFT")
    first = samples[sizes[0]][0]["first_tokens"]
    rows, per_size = [], []
    for ps in sizes:
        s = samples[ps]
        assert all(x["first_tokens"] == first for x in s), f"page size {ps} changed a greedy token"
        m = {k: median([x[k] for x in s]) for k in ("prefill_tok_s", "decode_tok_s", "ttft_sum_s")}
        lost, ideal = s[0]["lost"], s[0]["ideal"]
        per_size.append({"page_size": ps, "prefilled": s[0]["prefilled"], "ideal": ideal, "lost": lost,
                         "lost_pct_of_ideal": 100 * lost / ideal, **m, "samples": s})  # fmt: skip
        rows.append((ps, s[0]["prefilled"], ideal, lost, 100 * lost / ideal, m["prefill_tok_s"], m["decode_tok_s"],
                     m["ttft_sum_s"]))  # fmt: skip
    table = format_table(
        ["page size", "prefilled", "ideal", "lost", "lost %", "prefill tok/s", "decode tok/s", "sum TTFT s"],
        rows,
    )
    print(f"conversation: {len(prompts)} turns, final prompt {len(prompts[-1])} tokens")
    print(table)
    return {
        "page_sizes": per_size,
        "table": table,
        "turns": len(prompts),
        "final_prompt_tokens": len(prompts[-1]),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("page_size", __doc__.splitlines()[0])
    p.add_argument("--page-sizes", default="1,4,16,32,64")
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--system-tokens", type=int, default=250)
    p.add_argument("--min-new", type=int, default=150)
    p.add_argument("--max-new", type=int, default=250)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--kv-cache-memory", default="256M", help="pool per engine (one engine per page size)")
    args = p.parse_args(argv)
    if args.quick:
        args.page_sizes, args.turns, args.system_tokens, args.min_new, args.max_new = "1,16,64", 3, 60, 40, 60
        args.decode_tokens = 4
    return args


def main(argv: list[str] | None = None) -> int:
    return bench_main("page_size", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
