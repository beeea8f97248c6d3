"""Time the Triton paged-attention kernels on a CUDA GPU against the torch reference and the bandwidth floor.

Run from the repository root: ``python -m kvreuse.benchmarks.kernels.kernel_bench [--out PATH]``.

Shapes are Qwen3-0.6B's attention (16 query heads, 8 kv heads, head_dim 128, bf16, page_size 16) with
random data and a shuffled page table.  Decode is timed at each (context, batch) pair and compared with
the memory-bandwidth floor: the bytes of K/V it must read divided by the device copy bandwidth measured
in the same run (a large device-to-device copy, read + write bytes).  Prefill times extend attention on
new tokens with and without a cached prefix.  Times are medians from ``triton.testing.do_bench``, which
flushes L2 between repetitions, so small contexts are not flattered by cache hits.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from kvreuse.kernels import reference

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "kernels_gpu.json"
HQ, HKV, HEAD_DIM, PAGE_SIZE, DTYPE = 16, 8, 128, 16, torch.bfloat16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results path")
    p.add_argument("--contexts", default="1024,8192,32768", help="decode context lengths")
    p.add_argument("--batches", default="1,8,64", help="decode batch sizes")
    p.add_argument("--prefill", default="1024,8192", help="prefill (new-token) lengths")
    p.add_argument("--prefix", type=int, default=4096, help="cached prefix length for the 'with prefix' runs")
    p.add_argument("--no-reference", action="store_true", help="skip timing the torch reference")
    return p.parse_args(argv)


def ints(csv: str) -> list[int]:
    return [int(x) for x in csv.split(",") if x]


def bench_ms(fn: Callable[[], object]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))


def copy_bandwidth_gbps(device: torch.device, nbytes: int = 2 << 30) -> float:
    """Device copy bandwidth in GB/s counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3) / 1e9


def make_pool(seq_lens: list[int], device: torch.device, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """K/V pool holding ``seq_lens`` tokens per sequence on shuffled pages, and its page table."""
    pages = [(n + PAGE_SIZE - 1) // PAGE_SIZE for n in seq_lens]
    shape = (sum(pages), PAGE_SIZE, HKV, HEAD_DIM)
    k_cache = torch.randn(shape, dtype=DTYPE, device=device, generator=gen)
    v_cache = torch.randn(shape, dtype=DTYPE, device=device, generator=gen)
    order = torch.randperm(sum(pages), device=device, generator=gen).to(torch.int32)
    page_table = torch.zeros((len(seq_lens), max(pages)), dtype=torch.int32, device=device)
    start = 0
    for i, n in enumerate(pages):
        page_table[i, :n] = order[start : start + n]
        start += n
    seq_lens_k = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    return k_cache, v_cache, page_table, seq_lens_k


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def bench_decode(ctx: int, batch: int, bw_gbps: float, args: argparse.Namespace, tk) -> dict:
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(ctx + batch)
    k_cache, v_cache, page_table, seq_lens_k = make_pool([ctx] * batch, device, gen)
    q = torch.randn((batch, HQ, HEAD_DIM), dtype=DTYPE, device=device, generator=gen)
    call = (q, k_cache, v_cache, page_table, seq_lens_k, HEAD_DIM**-0.5)
    kv_bytes = 2 * batch * ctx * HKV * HEAD_DIM * k_cache.element_size()
    floor_ms = kv_bytes / (bw_gbps * 1e9) * 1e3
    out = tk.decode_attention(*call)
    row = {"context": ctx, "batch": batch, "kv_bytes": kv_bytes, "floor_ms": floor_ms}
    row["triton_ms"] = bench_ms(lambda: tk.decode_attention(*call))
    row["triton_fraction_of_floor"] = floor_ms / row["triton_ms"]
    row["triton_GBps"] = kv_bytes / (row["triton_ms"] * 1e-3) / 1e9
    if not args.no_reference:
        try:
            ref = reference.decode_attention(*call)
            row["max_abs_diff_vs_reference"] = max_abs_diff(out, ref)
            del ref
            row["reference_ms"] = bench_ms(lambda: reference.decode_attention(*call))
            row["speedup_vs_reference"] = row["reference_ms"] / row["triton_ms"]
        except torch.cuda.OutOfMemoryError:
            row["reference_ms"] = "oom"
    return row


def bench_extend(new: int, prefix: int, args: argparse.Namespace, tk) -> dict:
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(new + prefix)
    k_cache, v_cache, page_table, seq_lens_k = make_pool([prefix + new], device, gen)
    q = torch.randn((new, HQ, HEAD_DIM), dtype=DTYPE, device=device, generator=gen)
    cu = torch.tensor([0, new], dtype=torch.int32, device=device)
    call = (q, k_cache, v_cache, page_table, cu, seq_lens_k, HEAD_DIM**-0.5)
    # Causal pairs: new token j sees prefix + j + 1 keys; QK^T and PV are 2 flops per pair and dim each.
    pairs = new * prefix + new * (new + 1) // 2
    flops = 4 * pairs * HQ * HEAD_DIM
    out = tk.extend_attention(*call)
    row = {"new_tokens": new, "prefix": prefix, "flops": flops}
    row["triton_ms"] = bench_ms(lambda: tk.extend_attention(*call))
    row["triton_TFLOPs"] = flops / (row["triton_ms"] * 1e-3) / 1e12
    if not args.no_reference:
        try:
            ref = reference.extend_attention(*call)
            row["max_abs_diff_vs_reference"] = max_abs_diff(out, ref)
            del ref
            row["reference_ms"] = bench_ms(lambda: reference.extend_attention(*call))
            row["speedup_vs_reference"] = row["reference_ms"] / row["triton_ms"]
        except torch.cuda.OutOfMemoryError:
            row["reference_ms"] = "oom"
    return row


def run(args: argparse.Namespace) -> dict:
    import triton

    from kvreuse.kernels import triton_attention as tk

    device = torch.device("cuda")
    bw = copy_bandwidth_gbps(device)
    print(f"device copy bandwidth: {bw:.0f} GB/s", flush=True)
    result = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "shapes": {
            "q_heads": HQ,
            "kv_heads": HKV,
            "head_dim": HEAD_DIM,
            "page_size": PAGE_SIZE,
            "dtype": "bf16",
        },
        "copy_bandwidth_GBps": bw,
        "decode": [],
        "extend": [],
    }
    for ctx in ints(args.contexts):
        for batch in ints(args.batches):
            try:
                row = bench_decode(ctx, batch, bw, args, tk)
            except torch.cuda.OutOfMemoryError:
                row = {"context": ctx, "batch": batch, "error": "oom"}
            torch.cuda.empty_cache()
            result["decode"].append(row)
            print("decode", json.dumps(row), flush=True)
    for new in ints(args.prefill):
        for prefix in sorted({0, args.prefix}):
            row = bench_extend(new, prefix, args, tk)
            torch.cuda.empty_cache()
            result["extend"].append(row)
            print("extend", json.dumps(row), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("kernel_bench: no CUDA device available; this benchmark only runs on a GPU.", file=sys.stderr)
        return 2
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
