"""Cached-turn TTFT side by side with the peers: kvreuse, transformers and llama.cpp on one agent conversation.

Run from the repository root: ``python -m kvreuse.benchmarks.serving.cached_turns_peers --llamacpp-python PY
--llamacpp-module DIR [--llamacpp-preload SO] [--quick]`` (llama.cpp set up as in ``benchmarks/README.md``;
results in ``results/cached_turns_peers.json``).  The workload is ``cached_turns --agent``'s (SmolLM2-135M,
8 requests growing 1.6K -> 3.6K tokens); every side gets each turn's whole prompt in turn, alternating
turn by turn in one run, and reuses its own prefix across turns:

* **kvreuse**: the radix engine (``--attention-backend`` default), TTFT from the engine;
* **transformers**: a ``DynamicCache`` kept by hand across turns, fed only the tokens it lacks (as
  ``cached_turns``);
* **llama.cpp**: one context kept as llama-server keeps its slot (``benchmarks/peers/llamacpp_turns_side.py``,
  in its own interpreter, blocked on a pipe while the others run).

Weights: kvreuse and transformers run the dense weights (the embedded Q4_1 GGUF dequantised, in the
dtype); llama.cpp runs a GGUF converted from the same Q4_1 file by llama.cpp's own
``llama_model_quantize`` to F32 for the fp32 pass and BF16 for the bf16 pass (the same values), and, in the
fp32 pass, the Q4_1 file itself (what a llama.cpp user runs; its integer dot products are not a dtype
the ceiling measures, so its share of the fp32 ceiling is only a reference).  The build is the wheel's
prebuilt AVX2 one (no AVX-512, no AVX512-BF16 on this build).

Per turn and side: TTFT, the tokens it evaluated, its forward FLOPs (``kvreuse.benchmarks.kernels.extend.flops``
for those tokens on its cached prefix), and FLOPs / TTFT as a share of the dtype's matmul ceiling
(``cached_turns.matmul_ceiling``, best of before and after the dtype's turns).  ``first_token_same``: the
side's first token equals kvreuse's.  Summary: medians over the cached turns (2..) of each side's TTFT,
its ratio to kvreuse, and its share of the ceiling.

**The ceiling argument.**  A turn's minimum work is the FLOPs of its new tokens (the linears, one row of
the LM head, and exactly the causal attention pairs: ``flops`` counts nothing else), so no side can take
less than FLOPs / ceiling.  A TTFT of ``x`` times transformers' needs kvreuse at ``share_hf / x`` of the
ceiling; ``results/machine_ceiling.json`` puts the ceiling against the FMA issue rate of the same machine.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from kvreuse.benchmarks.common import base_parser, bench_main, format_table, median, model_dir, progress
from kvreuse.benchmarks.kernels.extend import flops
from kvreuse.benchmarks.serving.cached_turns import (
    AGENT_WORKLOAD,
    QUICK_WORKLOAD,
    common_prefix,
    matmul_ceiling,
)
from kvreuse.benchmarks.serving.ttft_multiturn import conversation_prompts

SIDE = Path(__file__).parent.parent / "peers" / "llamacpp_turns_side.py"
FTYPES = {"float32": (0, "f32"), "bfloat16": (32, "bf16")}  # llama_ftype ALL_F32, MOSTLY_BF16


def side_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    if args.llamacpp_preload:
        env["LD_PRELOAD"] = str(args.llamacpp_preload)
    return env


class LlamaCpp:
    """One llama.cpp context in its own interpreter, driven a turn at a time over a pipe."""

    def __init__(self, args: argparse.Namespace, gguf: Path, n_ctx: int) -> None:
        self.proc = subprocess.Popen(
            [str(args.llamacpp_python), str(SIDE), str(args.llamacpp_module)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=side_env(args),
            stderr=subprocess.DEVNULL,  # llama.cpp logs every layer
        )  # fmt: skip
        self.info = self._ask({"gguf": str(gguf), "threads": torch.get_num_threads(), "n_ctx": n_ctx})

    def _ask(self, msg: dict) -> dict:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"llama.cpp side exited ({self.proc.wait()})")
        return json.loads(line)

    def turn(self, prompt: list[int]) -> dict:
        return self._ask({"prompt": prompt})

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def dense_gguf(args: argparse.Namespace, src: Path, dtype: str) -> Path:
    """``src`` converted by llama.cpp to the dense ``dtype`` (made once, beside the converted weights)."""
    ftype, tag = FTYPES[dtype]
    dst = args.gguf_dir / f"{src.stem}.{tag}.gguf"
    if not dst.exists():
        args.gguf_dir.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_suffix(".tmp")
        job = json.dumps({"convert": {"src": str(src), "dst": str(tmp), "ftype": ftype}})
        done = subprocess.run([str(args.llamacpp_python), str(SIDE), str(args.llamacpp_module)], input=job,
                              capture_output=True, text=True, env=side_env(args), check=True)  # fmt: skip
        if json.loads(done.stdout)["rc"] != 0:
            raise SystemExit(f"llama.cpp could not convert {src} to {tag}")
        tmp.rename(dst)
    return dst


def side_row(name: str, ttft: float, new: int, cached: int, cfg) -> dict:
    return {f"ttft_{name}_s": ttft, f"new_{name}": new, f"gflop_{name}": flops(cfg, new, cached) / 1e9}


def run(args: argparse.Namespace) -> dict:
    from transformers import AutoModelForCausalLM, DynamicCache

    from kvreuse.runtime.engine.engine import Engine
    from kvreuse.runtime.loading.model_source import embedded_gguf_path
    from kvreuse.runtime.sampling.params import SamplingParams

    q4 = Path(args.gguf or embedded_gguf_path())
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    out: dict = {"weights": {"kvreuse": "dense (dequantised GGUF)", "transformers": "dense (dequantised GGUF)",
                             "llama.cpp": f"{q4.name} converted by llama.cpp to the dtype; llama.cpp-q4_1: "
                                          f"{q4.name} itself"}, "dtypes": args.dtypes, "per_dtype": {}}  # fmt: skip
    for dt in args.dtypes:
        dtype = getattr(torch, dt)
        eng = Engine(dtype=dt, quantize="none", kv_cache_memory="400M")
        cfg = eng.model_config
        hf = AutoModelForCausalLM.from_pretrained(model_dir(), dtype=dtype).eval()
        cache_arg = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
        prompts = conversation_prompts(eng.tokenizer, args.turns, args.seed, args.system_tokens,
                                       args.min_new, args.max_new)  # fmt: skip
        n_ctx = len(prompts[-1]) + 64
        llamas = {"llama.cpp": LlamaCpp(args, dense_gguf(args, q4, dt), n_ctx)}
        if dt == "float32":
            llamas["llama.cpp-q4_1"] = LlamaCpp(args, q4, n_ctx)
        eng.generate([prompts[0][:32]], params)  # warm-up every side
        for lc in llamas.values():
            lc.turn(prompts[0][:32])
            lc.turn([prompts[0][0] + 1])  # a miss at token 0: the context is emptied before turn 1
        with torch.inference_mode():
            hf(torch.tensor([prompts[0][:32]]), use_cache=True)
        ceiling = [matmul_ceiling(dtype)]
        cache, seen, rows = DynamicCache(), [], []
        for t, prompt in enumerate(prompts):
            o = eng.generate([prompt], params)[0]
            ref = o.output_token_ids[0]
            reuse = common_prefix(seen, prompt)
            with torch.inference_mode():
                t0 = time.perf_counter()
                res = hf(
                    torch.tensor([prompt[reuse:]]), use_cache=True, logits_to_keep=1, **{cache_arg: cache}
                )
                hf_tok = int(res.logits[0, -1].argmax())
                hf_s = time.perf_counter() - t0
            cache, seen = res.past_key_values, list(prompt)
            row = {"turn": t + 1, "prompt": len(prompt)}
            row |= side_row("kvreuse", o.ttft_s, len(prompt) - o.cached_tokens, o.cached_tokens, cfg)
            row |= side_row("transformers", hf_s, len(prompt) - reuse, reuse, cfg)
            row["same_transformers"] = hf_tok == ref
            for name, lc in llamas.items():
                r = lc.turn(prompt)
                row |= side_row(name, r["ttft_s"], r["evaluated"], r["n_past"], cfg)
                row[f"same_{name}"] = r["token"] == ref
            rows.append(row)
            progress(f"{dt} turn {t + 1}: " + ", ".join(f"{k[5:-2]} {v:.3f} s" for k, v in row.items()
                                                         if k.startswith("ttft_")))  # fmt: skip
        ceiling.append(matmul_ceiling(dtype))
        top = max(ceiling)
        sides = ["kvreuse", "transformers", *llamas]
        for r in rows:
            for s in sides:
                r[f"pct_ceiling_{s}"] = 100 * r[f"gflop_{s}"] * 1e9 / r[f"ttft_{s}_s"] / top
        cached = rows[1:]
        summary: dict = {"matmul_ceiling_gflops": [c / 1e9 for c in ceiling],
                         "llamacpp_system_info": next(iter(llamas.values())).info["system_info"]}  # fmt: skip
        for s in sides:
            summary[f"median_cached_ttft_{s}_s"] = median([r[f"ttft_{s}_s"] for r in cached])
            summary[f"median_cached_pct_ceiling_{s}"] = median([r[f"pct_ceiling_{s}"] for r in cached])
            summary[f"median_cached_ratio_{s}_to_kvreuse"] = median(
                [r[f"ttft_{s}_s"] / r["ttft_kvreuse_s"] for r in cached]
            )
            if s != "kvreuse":
                summary[f"turns_first_token_same_{s}"] = sum(r[f"same_{s}"] for r in rows)
        for lc in llamas.values():
            lc.close()
        out["per_dtype"][dt] = {"turns": rows, **summary}
        cols = (
            ["turn", "prompt"]
            + [c for s in sides for c in (f"new_{s}", f"ttft_{s}_s")]
            + [f"pct_ceiling_{s}" for s in sides]
        )
        print(format_table(cols, [tuple(r[c] for c in cols) for r in rows]))
        print(f"{dt} (ceiling {top / 1e9:.0f} GFLOP/s), medians of cached turns: " + "; ".join(
            f"{s} {summary[f'median_cached_ttft_{s}_s']:.3f} s = "
            f"{summary[f'median_cached_ratio_{s}_to_kvreuse']:.2f}x kvreuse, "
            f"{summary[f'median_cached_pct_ceiling_{s}']:.0f}% of the ceiling" for s in sides))  # fmt: skip
        del eng, hf, cache
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("cached_turns_peers", __doc__.splitlines()[0])
    p.add_argument("--llamacpp-python", type=Path, required=True, help="an interpreter with numpy and cffi")
    p.add_argument("--llamacpp-module", type=Path, required=True, help="the folder of _llama_cpp_cpu")
    p.add_argument("--llamacpp-preload", type=Path, default=None, help="LD_PRELOAD for the llama.cpp side")
    p.add_argument("--gguf", type=Path, default=None, help="the Q4_1 GGUF (default: the embedded one)")
    p.add_argument("--gguf-dir", type=Path, default=Path.home() / ".cache" / "kvreuse" / "converted",
                   help="where the dense GGUFs llama.cpp converts are kept")  # fmt: skip
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    args.turns, args.system_tokens, args.min_new, args.max_new = (
        QUICK_WORKLOAD if args.quick else AGENT_WORKLOAD
    )
    args.dtypes = args.dtypes.split(",")
    return args


def main(argv: list[str] | None = None) -> int:
    return bench_main("cached_turns_peers", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
