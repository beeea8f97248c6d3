"""Extend (cached-prefix) prefill cost vs cold prefill, against the FLOP model, fp32 and bf16.

Run from the repository root: ``python -m kvreuse.benchmarks.kernels.extend [--quick] [--out PATH] [--threads N]``.

For every prefix length P and new-token count N, in one process, rounds interleaved: TTFT of
``cold_n`` (a fresh N-token prompt), ``cold_pn`` (a fresh P+N-token prompt) and ``cached`` (a fresh
P-token prompt served first, untimed, then the same P tokens plus N fresh ones: the engine's radix cache
holds the prefix pages).  Each variant runs through the engine (default chunk size 512, so a long cold
prompt is itself a chain of extends), once per dtype.  The FLOP model counts the linears (2 x params per
token, the LM head once) and attention (4 x layers x heads x head_dim per visible query-key pair, causal
within the new tokens); ``measured / model`` within 1.1x is the target for ``cached / cold_n``.

``--baseline`` also runs the previous extend path (bf16 attention from library GEMMs,
``previous_extend``), same run, for the before/after of cold 2K/4K prefills.  ``--contention`` repeats a cached-vs-cold pair
with a second CPU-bound process on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys

from kvreuse.benchmarks.common import (
    base_parser,
    bench_main,
    format_table,
    median,
    progress,
    reps,
    synthetic_prompt,
)

RATIO_TARGET = 1.1


def flops(cfg, new: int, before: int) -> float:
    """Forward FLOPs of ``new`` tokens after ``before`` cached ones (one sampled row)."""
    h, i, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    per_layer = h * (cfg.num_heads + 2 * cfg.num_kv_heads) * hd + cfg.num_heads * hd * h + 3 * h * i
    linear = 2 * cfg.num_layers * per_layer * new + 2 * h * cfg.vocab_size
    pairs = new * before + new * (new + 1) / 2
    return linear + 4 * cfg.num_layers * cfg.num_heads * hd * pairs


@contextlib.contextmanager
def previous_extend(engine):
    """The extend path before the flash kernel (``kernels/cpu/extend_attention.c``) on ``engine``: the
    reference's, bf16 from oneDNN GEMMs plus the C row softmax (``kernels/cpu_matmul_attention.py``).
    fp32 runs the same ``kvreuse.kernels.reference`` path on both sides."""
    from kvreuse.kernels import reference

    runner = engine.runner
    saved = runner.backend
    runner.backend = saved._replace(extend_attention=reference.extend_attention)
    try:
        yield
    finally:
        runner.backend = saved


class Runs:
    """One radix engine per dtype; each method returns (TTFT seconds, cached tokens)."""

    def __init__(self, dtype: str, memory: str) -> None:
        from kvreuse.runtime.engine.engine import Engine
        from kvreuse.runtime.sampling.params import SamplingParams

        self.engine = Engine(dtype=dtype, kv_cache_memory=memory)
        self.params = SamplingParams(max_tokens=1, ignore_eos=True)
        self.seed = 1000 if dtype == "float32" else 500000

    def _fresh(self, n: int) -> list[int]:
        self.seed += 1
        return synthetic_prompt(n, self.seed)

    def _ttft(self, prompt: list[int]) -> tuple[float, int]:
        out = self.engine.generate([prompt], self.params)[0]
        return out.ttft_s, out.cached_tokens

    def cold(self, n: int) -> tuple[float, int]:
        self.engine.reset_prefix_cache()
        return self._ttft(self._fresh(n))

    def cached(self, p: int, n: int) -> tuple[float, int]:
        self.engine.reset_prefix_cache()
        prefix = self._fresh(p)
        self._ttft(prefix)
        return self._ttft(prefix + self._fresh(n))


def grid(args: argparse.Namespace, runs: dict[str, Runs], n_reps: int) -> list[dict]:
    """Every (dtype, P, N) point: cold N, cold P+N and cached, interleaved per round."""
    samples: dict[tuple, list] = {}
    for r in range(n_reps):
        for n in args.new:
            for dt, run in runs.items():
                samples.setdefault((dt, "cold_n", 0, n), []).append(run.cold(n))
                for p in args.prefix:
                    samples.setdefault((dt, "cached", p, n), []).append(run.cached(p, n))
                    samples.setdefault((dt, "cold_pn", p, n), []).append(run.cold(p + n))
            progress(f"round {r} N={n} done")
    points = []
    for dt, run in runs.items():
        cfg = run.engine.model_config
        for p in args.prefix:
            for n in args.new:
                t = {v: median([s[0] for s in samples[(dt, v, p if v != "cold_n" else 0, n)]])
                     for v in ("cold_n", "cold_pn", "cached")}  # fmt: skip
                got = samples[(dt, "cached", p, n)][0][1]  # whole pages of the prefix
                new = p + n - got
                model_n = flops(cfg, new, got) / flops(cfg, n, 0)
                model_pn = flops(cfg, new, got) / flops(cfg, p + n, 0)
                meas_n, meas_pn = t["cached"] / t["cold_n"], t["cached"] / t["cold_pn"]
                points.append({
                    "dtype": dt, "prefix": p, "new": n, "cached_tokens": got, "ttft_s": t,
                    "cached_over_cold_n": meas_n, "model_cached_over_cold_n": model_n,
                    "vs_model_n": meas_n / model_n, "cached_over_cold_pn": meas_pn,
                    "model_cached_over_cold_pn": model_pn, "vs_model_pn": meas_pn / model_pn,
                    "samples": {v: [s[0] for s in samples[(dt, v, p if v != "cold_n" else 0, n)]]
                                for v in ("cold_n", "cold_pn", "cached")},
                })  # fmt: skip
    return points


def cold_before_after(args: argparse.Namespace, runs: dict[str, Runs], n_reps: int) -> list[dict]:
    """Cold 2K/4K prefills with the new and the previous extend path, rounds interleaved."""
    times: dict[tuple, list[float]] = {}
    for _ in range(n_reps):
        for n in args.cold:
            for dt, run in runs.items():
                times.setdefault((dt, n, "new"), []).append(run.cold(n)[0])
                with previous_extend(run.engine):
                    times.setdefault((dt, n, "before"), []).append(run.cold(n)[0])
    return [{"dtype": dt, "tokens": n, "new_s": median(times[(dt, n, "new")]),
             "before_s": median(times[(dt, n, "before")]),
             "new_over_before": median(times[(dt, n, "new")]) / median(times[(dt, n, "before")])}
            for dt in runs for n in args.cold]  # fmt: skip


def contention(args: argparse.Namespace, runs: dict[str, Runs], n_reps: int) -> list[dict]:
    """Cached vs cold prefill of the same prompt length with a busy-looping process alongside."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    rows = []
    try:
        for p, n in args.contention_points:
            for dt, run in runs.items():
                cached, cold = [], []
                for i in range(max(n_reps, 3)):  # a busy neighbour makes single samples noisy
                    # alternate which goes first, so a drift of the neighbour's share favours neither
                    if i % 2 == 0:
                        cached.append(run.cached(p, n)[0])
                    cold.append(run.cold(p + n)[0])
                    if i % 2 == 1:
                        cached.append(run.cached(p, n)[0])
                rows.append({"dtype": dt, "prefix": p, "new": n, "cached_s": median(cached),
                             "cold_same_prompt_s": median(cold), "cached_over_cold": median(cached) / median(cold),
                             "paired_median": median([a / b for a, b in zip(cached, cold)]),
                             "samples": {"cached": cached, "cold": cold}})  # fmt: skip
                progress(f"contention {dt} P={p} N={n}: {rows[-1]['cached_over_cold']:.2f}")
    finally:
        hog.kill()
        hog.wait()
    return rows


def run(args: argparse.Namespace) -> dict:
    runs = {dt: Runs(dt, args.kv_cache_memory) for dt in args.dtypes}
    for run_ in runs.values():  # warm-up: first calls pay for allocation and kernel selection
        run_.cached(32, 64)
    n_reps = reps(args, 2)
    out: dict = {"model_weights": "dense (the embedded model's GGUF dequantised)", "dtypes": args.dtypes}
    out["points"] = pts = grid(args, runs, n_reps)
    rows = [(p["dtype"], p["prefix"], p["new"], p["cached_tokens"], p["ttft_s"]["cached"], p["ttft_s"]["cold_n"],
             p["ttft_s"]["cold_pn"], p["cached_over_cold_n"], p["model_cached_over_cold_n"], p["vs_model_n"],
             p["cached_over_cold_pn"], p["model_cached_over_cold_pn"]) for p in pts]  # fmt: skip
    heads = ["dtype", "P", "N", "cached", "cached s", "cold N s", "cold P+N s", "cached/coldN", "model",
             "meas/model", "cached/coldPN", "model"]  # fmt: skip
    out["table"] = format_table(heads, rows)
    print(out["table"])
    if len(runs) == 2:
        bf = {(p["prefix"], p["new"]): p["ttft_s"]["cached"] for p in pts if p["dtype"] == "bfloat16"}
        fp = {(p["prefix"], p["new"]): p["ttft_s"]["cached"] for p in pts if p["dtype"] == "float32"}
        out["bf16_over_fp32_cached"] = {f"{k[0]}+{k[1]}": bf[k] / fp[k] for k in fp}
    out["within_target"] = all(p["vs_model_n"] <= RATIO_TARGET for p in pts)
    if args.baseline:
        out["cold_before_after"] = cold_before_after(args, runs, n_reps)
        print(format_table(["dtype", "tokens", "new s", "before s", "new/before"],
                           [tuple(r.values()) for r in out["cold_before_after"]]))  # fmt: skip
    if args.contention:
        out["contention"] = contention(args, runs, n_reps)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("extend", __doc__.splitlines()[0])
    p.add_argument("--prefix", default="16,1000,4000", help="cached prefix lengths P")
    p.add_argument("--new", default="300,1000,2000", help="new token counts N")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--cold", default="2048,4096", help="cold prefill lengths for --baseline")
    p.add_argument("--baseline", action="store_true", help="also time cold prefills on the previous path")
    p.add_argument("--contention", action="store_true", help="also cached vs cold beside a busy process")
    p.add_argument("--kv-cache-memory", default="1G")
    args = p.parse_args(argv)
    if args.quick:
        args.prefix, args.new, args.cold = "16,200", "100,300", "600"
    args.prefix = [int(x) for x in str(args.prefix).split(",")]
    args.new = [int(x) for x in str(args.new).split(",")]
    args.cold = [int(x) for x in str(args.cold).split(",")]
    args.dtypes = str(args.dtypes).split(",")
    args.contention_points = [(16, 1500), (1000, 1000)] if not args.quick else [(16, 300)]
    return args


def main(argv: list[str] | None = None) -> int:
    return bench_main("extend", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
