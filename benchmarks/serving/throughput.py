"""Prefill and single-stream decode throughput: kvreuse vs transformers, same model, dtype and process.

Run from the repository root: ``python -m kvreuse.benchmarks.serving.throughput [--quick] [--out PATH] [--threads N]``.

* prefill: tokens/s of one prompt of 512 and 2048 tokens.  kvreuse runs with ``prefix_cache="off"`` and a
  fresh random prompt every repetition (nothing can be cached) and ``chunk_size`` = the prompt length, so
  both sides do one forward; time = the request's TTFT.  transformers: one ``model(input_ids)`` forward.
* decode: tokens/s of one stream generating ``--decode-tokens`` greedy tokens after a short prompt.
  kvreuse: ``decode_s / (n - 1)`` (the first token comes from prefill).  transformers: ``generate`` with
  ``min_new_tokens = max_new_tokens = n`` minus a prefill forward of the same prompt timed in the same round.

Repetitions alternate kvreuse / transformers; figures are medians; ratios are kvreuse / transformers.
"""

from __future__ import annotations

import argparse
import sys

import torch

from kvreuse.benchmarks.common import (
    base_parser,
    bench_main,
    format_table,
    interleave,
    median,
    model_dir,
    reps,
    synthetic_prompt,
    timed,
)

PREFILL_TARGET, DECODE_TARGET = 1.0, 1.2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("throughput", __doc__.splitlines()[0])
    p.add_argument("--prefill-lengths", default="512,2048", help="prompt lengths for prefill")
    p.add_argument("--decode-tokens", type=int, default=128, help="tokens generated in the decode run")
    p.add_argument("--decode-prompt", type=int, default=128, help="prompt length before the decode run")
    args = p.parse_args(argv)
    if args.quick:
        args.prefill_lengths, args.decode_tokens, args.decode_prompt = "128,256", 8, 32
    return args


class Sides:
    """The kvreuse engine and the transformers model, loaded once; each method returns seconds."""

    def __init__(self, max_prompt: int) -> None:
        from transformers import AutoModelForCausalLM

        from kvreuse.runtime.engine.engine import Engine

        self.engine = Engine(
            dtype="float32", prefix_cache="off", chunk_size=max_prompt, kv_cache_memory="512M"
        )
        self.hf = AutoModelForCausalLM.from_pretrained(model_dir(), dtype=torch.float32).eval()
        self.seed = 0

    def fresh(self, n: int) -> list[int]:
        self.seed += 1
        return synthetic_prompt(n, self.seed)

    def kv_prefill(self, n: int) -> float:
        from kvreuse.runtime.sampling.params import SamplingParams

        out = self.engine.generate([self.fresh(n)], SamplingParams(max_tokens=1, ignore_eos=True))[0]
        assert out.prefilled_tokens == n and out.cached_tokens == 0
        return out.ttft_s

    def hf_prefill(self, n: int) -> float:
        ids = torch.tensor([self.fresh(n)])
        with torch.inference_mode():
            return timed(lambda: self.hf(ids))[0]

    def kv_decode(self, prompt: int, n: int) -> float:
        from kvreuse.runtime.sampling.params import SamplingParams

        out = self.engine.generate([self.fresh(prompt)], SamplingParams(max_tokens=n, ignore_eos=True))[0]
        assert len(out.output_token_ids) == n
        return out.decode_s

    def hf_decode(self, prompt: int, n: int) -> float:
        ids = torch.tensor([self.fresh(prompt)])
        eos = self.hf.generation_config.eos_token_id
        pad = eos[0] if isinstance(eos, list) else eos
        with torch.inference_mode():
            prefill = timed(lambda: self.hf(ids))[0]
            total, out = timed(
                lambda: self.hf.generate(
                    ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=pad
                )
            )
        assert out.shape[1] == prompt + n
        return total - prefill


def run(args: argparse.Namespace) -> dict:
    lengths = [int(x) for x in args.prefill_lengths.split(",") if x]
    sides = Sides(max(lengths))
    n_reps = reps(args)
    for warm in (sides.kv_prefill, sides.hf_prefill):  # first calls pay for allocation and kernel selection
        warm(64)
    sides.kv_decode(16, 4)
    sides.hf_decode(16, 4)
    rows, results = [], {"prefill": [], "decode": None}
    for n in lengths:
        t = interleave(
            {
                "kvreuse": lambda r, n=n: sides.kv_prefill(n),
                "transformers": lambda r, n=n: sides.hf_prefill(n),
            },
            n_reps,
        )
        kv, hf = n / median(t["kvreuse"]), n / median(t["transformers"])
        results["prefill"].append(
            {
                "prompt_tokens": n,
                "kvreuse_tok_s": kv,
                "transformers_tok_s": hf,
                "ratio": kv / hf,
                "times_s": t,
            }
        )
        rows.append((f"prefill {n}", kv, hf, kv / hf, PREFILL_TARGET, kv / hf >= PREFILL_TARGET))
    d, pl = args.decode_tokens, args.decode_prompt
    t = interleave(
        {"kvreuse": lambda r: sides.kv_decode(pl, d), "transformers": lambda r: sides.hf_decode(pl, d)},
        n_reps,
    )
    kv, hf = (d - 1) / median(t["kvreuse"]), (d - 1) / median(t["transformers"])
    results["decode"] = {
        "prompt_tokens": pl,
        "new_tokens": d,
        "kvreuse_tok_s": kv,
        "transformers_tok_s": hf,
        "ratio": kv / hf,
        "times_s": t,
    }
    rows.append((f"decode {d} (prompt {pl})", kv, hf, kv / hf, DECODE_TARGET, kv / hf >= DECODE_TARGET))
    table = format_table(["run", "kvreuse tok/s", "transformers tok/s", "ratio", "target", "met"], rows)
    print(table)
    results["table"] = table
    results["targets"] = {"prefill_ratio": PREFILL_TARGET, "decode_ratio": DECODE_TARGET}
    results["dtype"] = "float32"  # both implementations, whatever the CPU's default
    return results


def main(argv: list[str] | None = None) -> int:
    return bench_main("throughput", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
