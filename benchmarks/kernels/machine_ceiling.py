"""Is the matmul ceiling ``cached_turns`` divides by the machine's limit?  GEMM rates against the FMA peak.

Run from the repository root: ``python -m kvreuse.benchmarks.kernels.machine_ceiling [--quick]`` (results in
``results/machine_ceiling.json``).

Three views of one machine, each at 1 and at every thread (``torch.get_num_threads()`` at start):

* **peak**: the instruction issue rate of 12 independent accumulator chains (``benchmarks/kernels/machine_peak.c``,
  built by ``kvreuse.kernels.cpu_build``): fp32 ``vfmadd`` on zmm and ymm, bf16 ``vdpbf16ps`` on zmm, and
  the core clock from a dependent integer-add chain run just before (FLOP/cycle/core = rate / clock /
  threads, which names the microarchitecture's FMA width);
* **gemm**: the best of ``--reps`` calls of ``torch.matmul`` on ``SHAPES`` (the model's linears at a
  cached turn's ~300 rows, ``cached_turns``' own ceiling shapes, and square GEMMs up to 4096), per dtype,
  with oneDNN on (torch's default) and off (``torch.backends.mkldnn.flags(enabled=False)``: MKL for fp32;
  bf16 falls to torch's own GEMM, so only on the first shape), and fp32 through oneDNN's own linear (``torch._C._nn.mkldnn_linear``);
* per dtype, the best GEMM rate over all of these as a share of that dtype's peak at the same threads.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

import torch

from kvreuse.benchmarks.common import base_parser, bench_main, format_table, progress, reps
from kvreuse.kernels.cpu_build import compile_library

# [m, k] @ [k, n]
SHAPES = [(300, 576, 1536), (300, 1536, 576), (300, 576, 576), (512, 576, 1536), (512, 1536, 576),
          (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096)]  # fmt: skip
QUICK_SHAPES = [(300, 576, 1536), (1024, 1024, 1024)]
KINDS = {"fp32 fma zmm": 0, "fp32 fma ymm": 1, "bf16 vdpbf16ps zmm": 2}


def peak_lib() -> ctypes.CDLL | None:
    lib = compile_library(Path(__file__).with_name("machine_peak.c"))
    if lib is not None:
        lib.peak_clock_ghz.restype = ctypes.c_double
        lib.peak_clock_ghz.argtypes = [ctypes.c_int, ctypes.c_long]
        lib.peak_gflops.restype = ctypes.c_double
        lib.peak_gflops.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long]
    return lib


def peaks(lib: ctypes.CDLL, thread_counts: list[int], n_reps: int, iters: int) -> list[dict]:
    rows = []
    for name, kind in KINDS.items():
        for th in thread_counts:
            ghz = max(lib.peak_clock_ghz(th, iters // 10) for _ in range(n_reps))
            gflops = max(lib.peak_gflops(kind, th, iters) for _ in range(n_reps))
            if gflops < 0:
                continue
            rows.append({"kind": name, "threads": th, "gflops": gflops, "clock_ghz": ghz,
                         "flop_per_cycle_core": gflops / ghz / th})  # fmt: skip
            progress(f"peak {name} threads {th}: {gflops:.0f} GFLOP/s at {ghz:.2f} GHz")
    return rows


def gemm_rate(fn, args: tuple, flop: float, n_reps: int) -> float:
    """GFLOP/s of the best of ``n_reps`` timed calls ``fn(*args)`` after one untimed."""
    fn(*args)
    best = 0.0
    for _ in range(n_reps):
        t0 = time.perf_counter()
        fn(*args)
        best = max(best, flop / (time.perf_counter() - t0))
    return best / 1e9


def gemms(shapes: list[tuple[int, int, int]], thread_counts: list[int], n_reps: int) -> list[dict]:
    rows = []
    for th in thread_counts:
        torch.set_num_threads(th)
        for dtype in (torch.float32, torch.bfloat16):
            for m, k, n in shapes:
                a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
                flop = 2.0 * m * k * n
                row = {"threads": th, "dtype": str(dtype).removeprefix("torch."), "m": m, "k": k, "n": n}
                r = n_reps if flop < 50e9 else 2
                row["onednn_on"] = gemm_rate(torch.matmul, (a, b), flop, r)
                row["onednn_off"] = None  # bf16 without oneDNN: ~0.3-0.7 GFLOP/s, once on the smallest shape
                if dtype == torch.float32 or (m, k, n) == shapes[0]:
                    with torch.backends.mkldnn.flags(enabled=False):
                        row["onednn_off"] = gemm_rate(
                            torch.matmul, (a, b), flop, r if dtype == torch.float32 else 1
                        )
                row["onednn_linear"] = None
                if dtype == torch.float32 and torch.backends.mkldnn.is_available():
                    xa, wb = a.to_mkldnn(), b.t().contiguous().to_mkldnn()
                    row["onednn_linear"] = gemm_rate(torch._C._nn.mkldnn_linear, (xa, wb, None), flop, r)
                rows.append(row)
                progress(f"gemm {row}")
    return rows


def run(args: argparse.Namespace) -> dict:
    threads = torch.get_num_threads()
    thread_counts = sorted({1, threads})
    n_reps = reps(args, 5)
    out: dict = {"thread_counts": thread_counts, "peak": [], "gemm": []}
    lib = peak_lib()
    if lib is not None:
        out["peak"] = peaks(lib, thread_counts, n_reps, 20_000_000 if args.quick else 200_000_000)
    out["gemm"] = gemms(QUICK_SHAPES if args.quick else SHAPES, thread_counts, n_reps)
    torch.set_num_threads(threads)
    best: dict = {}
    for r in out["gemm"]:
        rate = max(v for v in (r["onednn_on"], r["onednn_off"], r["onednn_linear"]) if v is not None)
        key = (r["dtype"], r["threads"])
        if rate > best.get(key, (0.0,))[0]:
            best[key] = (rate, f"{r['m']}x{r['k']}x{r['n']}")
    peak_of = {"float32": "fp32 fma zmm", "bfloat16": "bf16 vdpbf16ps zmm"}
    summary = []
    for (dt, th), (rate, shape) in sorted(best.items()):
        pk = next((p["gflops"] for p in out["peak"] if p["kind"] == peak_of[dt] and p["threads"] == th), None)
        summary.append({"dtype": dt, "threads": th, "best_gemm_gflops": rate, "best_shape": shape,
                        "peak_gflops": pk, "pct_peak": 100 * rate / pk if pk else None})  # fmt: skip
    out["summary"] = summary
    if out["peak"]:
        print(format_table(list(out["peak"][0]), [tuple(p.values()) for p in out["peak"]]))
    print(format_table(list(out["gemm"][0]), [tuple(r.values()) for r in out["gemm"]]))
    print(format_table(list(summary[0]), [tuple(s.values()) for s in summary]))
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return base_parser("machine_ceiling", __doc__.splitlines()[0]).parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return bench_main("machine_ceiling", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
