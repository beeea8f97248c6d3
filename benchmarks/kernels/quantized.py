"""The embedded Q4_1 GGUF kept quantized (``--quantize gguf``) vs dense bf16 / fp32 and vs llama.cpp.

Run from the repository root: ``python -m kvreuse.benchmarks.kernels.quantized [--quick] [--llamacpp-python PY
--llamacpp-module DIR] [--threads N]``.

* agreement: greedy 64 tokens on 5 chat prompts, ours (gguf) vs llama.cpp on the same GGUF file: tokens
  equal position by position, and the length of the common prefix (quantized arithmetic differs, so an
  early near-tie sends the two down different continuations; both are reported);
* perplexity of a fixed text (every row's logits in one forward), gguf vs the dequantized fp32 model;
* decode tokens/s of one stream after a short prompt and after a ``--long``-token one (the agent
  workload's context), prefill tokens/s of a fresh 1,000-token prompt: gguf, gguf on the torch
  decode ops (``--attention-backend reference``: the path before the fused CPU kernels), bf16, fp32
  and llama.cpp (same thread count), rounds interleaved, medians.

llama.cpp runs in its own interpreter (``benchmarks/peers/llamacpp_side.py``): a prebuilt CPU build from the
``llama-cpp-cffi`` wheel, never a kvreuse dependency; without ``--llamacpp-python`` it is skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from kvreuse.benchmarks.common import (
    base_parser,
    bench_main,
    format_table,
    median,
    progress,
    reps,
    synthetic_prompt,
)

PROMPTS = [
    "Write a haiku about the sea.",
    "Explain what a hash map is in two sentences.",
    "List three prime numbers and explain why they are prime.",
    "What is the capital of France? Answer briefly.",
    "Give me a short Python function that reverses a string.",
]
TEXT = (
    "The history of computing is a story of abstraction. Early machines were programmed by rewiring "
    "panels and flipping switches, and every program was tied to the hardware it ran on. Assembly "
    "languages gave names to instructions, compilers translated readable code into machine code, and "
    "operating systems hid the details of memory and devices behind simple interfaces. Each layer let "
    "programmers think about larger problems while trusting the layers below. Today a developer can "
    "write a few lines that fetch data from a server on another continent, transform it, and draw a "
    "chart, without knowing how the network, the processor or the screen actually work. The cost of "
    "this convenience is that performance problems often hide in layers nobody looks at, and the "
    "engineers who can move between levels, from a slow query down to a cache miss, remain rare and "
    "valuable. Good tools make those layers visible again when it matters."
)


def chat_ids(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def perplexity(engine, ids: list[int], chunk_size: int | None = None) -> float:
    """exp(mean NLL) of ``ids[1:]`` given their prefixes, from the engine's prompt scoring (every row's
    logits, chunk by chunk, on scratch pages: the same path as ``echo`` with ``logprobs``).  Chunks of
    8 put the LM head on the kernel a decode step uses (the Q8_0 head's, activations quantized)."""
    entries = engine.prompt_logprobs(ids, 0, chunk_size)
    nll = -sum(lp for _, e in entries[1:] for lp in (e[0],)) / (len(ids) - 1)
    return math.exp(nll)


def ours(engine, prompts: list[list[int]], new: int) -> list[dict]:
    from kvreuse.runtime.sampling.params import SamplingParams

    res = []
    for p in prompts:
        engine.reset_prefix_cache()
        t0 = time.perf_counter()
        out = engine.generate([p], SamplingParams(max_tokens=new, ignore_eos=True))[0]
        total = time.perf_counter() - t0
        res.append({"tokens": out.output_token_ids, "ttft_s": out.ttft_s, "decode_s": total - out.ttft_s})
    return res


def llamacpp(args: argparse.Namespace, prompts: list[list[int]], new: int) -> dict:
    job = {"gguf": str(args.gguf), "threads": torch.get_num_threads(), "prompts": prompts, "new": new}
    env = dict(os.environ, LD_PRELOAD=args.llamacpp_preload) if args.llamacpp_preload else None
    side = Path(__file__).resolve().parents[1] / "peers" / "llamacpp_side.py"
    r = subprocess.run([args.llamacpp_python, str(side), args.llamacpp_module], input=json.dumps(job),
                       capture_output=True, text=True, env=env, check=True)  # fmt: skip
    return json.loads(r.stdout)


def agreement(a: list[int], b: list[int]) -> tuple[float, int]:
    same = sum(x == y for x, y in zip(a, b)) / max(len(a), 1)
    prefix = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return same, prefix


def run(args: argparse.Namespace) -> dict:
    from kvreuse.runtime.engine.engine import Engine
    from kvreuse.runtime.loading.model_source import embedded_gguf_path

    args.gguf = embedded_gguf_path()
    # "cpu" is the fused C decode kernels (the default on CPU); "reference" the torch ops they replace
    variants = {"gguf": ("bfloat16", "gguf", "cpu"), "gguf-torch": ("bfloat16", "gguf", "reference"),
                "bf16": ("bfloat16", "none", "cpu"), "fp32": ("float32", "none", "cpu")}  # fmt: skip
    engines = {k: Engine(dtype=dt, quantize=q, attention_backend=b, kv_cache_memory="160M")
               for k, (dt, q, b) in variants.items()}  # fmt: skip
    progress(
        f"threads {torch.get_num_threads()}; "
        + ", ".join(f"{k}: {v[1]} weights, {v[0]}, {v[2]} backend" for k, v in variants.items())
    )
    tok = engines["gguf"].tokenizer
    chats = [chat_ids(tok, p) for p in PROMPTS[: 2 if args.quick else 5]]
    text = tok.encode(TEXT, add_special_tokens=False)
    out: dict = {"threads": torch.get_num_threads(),
                 "weights": {k: f"{q} ({dt} activations, KV cache {dt}, {b} decode kernels)"
                             for k, (dt, q, b) in variants.items()}}  # fmt: skip
    out["perplexity"] = {k: perplexity(engines[k], text) for k in ("gguf", "fp32", "bf16")}
    out["perplexity"]["gguf_decode_kernels"] = perplexity(engines["gguf"], text, 8)
    for k in ("gguf", "gguf_decode_kernels"):
        out["perplexity"][f"{k}_over_fp32"] = out["perplexity"][k] / out["perplexity"]["fp32"]
    progress(f"perplexity {out['perplexity']}")
    decode_prompt = chats[:1]
    for e in engines.values():  # warm-up
        ours(e, [decode_prompt[0][:16]], 4)
    long_prompt = synthetic_prompt(args.long, 99)
    samples: dict[str, dict[str, list[float]]] = {}
    greedy: dict[str, list] = {}
    have_lcp = bool(args.llamacpp_python)
    for r in range(reps(args, 2)):
        for k, e in engines.items():
            res = ours(e, decode_prompt, args.new)
            samples.setdefault(k, {"decode": [], "decode_long": [], "prefill": []})["decode"].append(
                (args.new - 1) / res[0]["decode_s"]
            )
            res_l = ours(e, [long_prompt], args.new)
            samples[k]["decode_long"].append((args.new - 1) / res_l[0]["decode_s"])
            e.reset_prefix_cache()
            p = synthetic_prompt(args.prefill, 7000 + r)
            res_p = ours(e, [p], 1)
            samples[k]["prefill"].append(args.prefill / res_p[0]["ttft_s"])
            progress(
                f"round {r} {k}: decode {samples[k]['decode'][-1]:.1f} tok/s, prefill {samples[k]['prefill'][-1]:.0f} tok/s"
            )
        if have_lcp:
            lr = llamacpp(
                args, decode_prompt + [long_prompt, synthetic_prompt(args.prefill, 7000 + r)], args.new
            )
            d = samples.setdefault("llama.cpp", {"decode": [], "decode_long": [], "prefill": []})
            d["decode"].append((args.new - 1) / lr["results"][0]["decode_s"])
            d["decode_long"].append((args.new - 1) / lr["results"][1]["decode_s"])
            d["prefill"].append(args.prefill / lr["results"][2]["prefill_s"])
            out["llamacpp_system_info"] = lr["system_info"]
            progress(
                f"round {r} llama.cpp: decode {d['decode'][-1]:.1f} tok/s, prefill {d['prefill'][-1]:.0f} tok/s"
            )
    greedy["gguf"] = [x["tokens"] for x in ours(engines["gguf"], chats, args.new)]
    greedy["fp32"] = [x["tokens"] for x in ours(engines["fp32"], chats, args.new)]
    greedy["gguf-torch"] = [x["tokens"] for x in ours(engines["gguf-torch"], chats, args.new)]
    if have_lcp:
        greedy["llama.cpp"] = [x["tokens"] for x in llamacpp(args, chats, args.new)["results"]]
    out["agreement"] = {}
    for other in [k for k in greedy if k != "gguf"]:
        pairs = [agreement(a, b) for a, b in zip(greedy["gguf"], greedy[other])]
        out["agreement"][f"gguf_vs_{other}"] = {"per_prompt_same_fraction": [p[0] for p in pairs],
                                                "per_prompt_common_prefix": [p[1] for p in pairs],
                                                "mean_same_fraction": sum(p[0] for p in pairs) / len(pairs)}  # fmt: skip
    med = {k: {m: median(v) for m, v in d.items()} for k, d in samples.items()}
    out["tokens_per_s"], out["samples"], out["greedy"] = med, samples, greedy
    rows = [(k, med[k]["decode"], med[k]["decode_long"], med[k]["prefill"], med[k]["decode"] / med["bf16"]["decode"],
             med[k]["prefill"] / med["bf16"]["prefill"]) for k in med]  # fmt: skip
    out["table"] = format_table(
        [
            "weights",
            "decode tok/s",
            f"decode at {args.long}",
            "prefill tok/s",
            "decode x bf16",
            "prefill x bf16",
        ],
        rows,
    )
    if "llama.cpp" in med:
        lcp = samples["llama.cpp"]
        for k in ("gguf", "gguf-torch"):
            out[f"{k}_decode_over_llamacpp"] = {
                m: med[k][m] / med["llama.cpp"][m] for m in ("decode", "decode_long")
            }
            # the same ratio paired by round (both sides ran within a minute of each other): the
            # machine's speed drifts by +-15% between rounds, which a ratio of medians mixes in
            out[f"{k}_decode_over_llamacpp_paired"] = {
                m: median([a / b for a, b in zip(samples[k][m], lcp[m])]) for m in ("decode", "decode_long")
            }
    print(out["table"])
    print(json.dumps({k: out[k] for k in ("perplexity", "agreement")}, indent=1))
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("quantized", __doc__.splitlines()[0])
    p.add_argument("--new", type=int, default=64, help="greedy tokens per prompt")
    p.add_argument("--prefill", type=int, default=1000, help="prompt tokens of the prefill run")
    p.add_argument("--long", type=int, default=2000, help="prompt tokens before the long-context decode")
    p.add_argument("--llamacpp-python", default=None, help="interpreter with numpy + cffi for llama.cpp")
    p.add_argument("--llamacpp-module", default=None, help="folder holding the _llama_cpp_cpu CFFI module")
    p.add_argument("--llamacpp-preload", default=None, help="LD_PRELOAD for that module (a libstdc++ shim)")
    args = p.parse_args(argv)
    if args.quick:
        args.new, args.prefill, args.long = 16, 200, 300
    return args


def main(argv: list[str] | None = None) -> int:
    return bench_main("quantized", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
