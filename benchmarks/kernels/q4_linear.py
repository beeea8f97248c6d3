"""Time the int4 linear for a few rows (``kernels/cpu/q4_linear.c``) against torch's packed int4 CPU
kernel (``_weight_int4pack_mm_for_cpu``) and the dequantize-then-dense path, on SmolLM2-135M's layer
shapes (qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536; random int4 weights), bf16 rows.

Run from the repository root: ``python -m kvreuse.benchmarks.kernels.q4_linear [--rows 1,2,4,8,16]``.  Each figure is
ms for all 30 layers (the four shapes called in turn, the median of ``--reps`` rounds of ``--iters``
calls each, x 30), the three paths interleaved in each round so that they share the machine's load.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from kvreuse.benchmarks.common import base_parser, bench_main, format_table, interleave, median, reps
from kvreuse.kernels.native_cpu import load
from kvreuse.runtime.models.quant_linear import GROUP, DequantScratch, quantize_int4

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
LAYERS = 30


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = base_parser("q4_linear", __doc__.splitlines()[0])
    p.add_argument("--rows", default="1,2,4,8,16", help="row counts")
    p.add_argument("--iters", type=int, default=20, help="calls of the four shapes per timed round")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    ops = load()
    if ops is None:
        raise SystemExit("the C kernels did not build: nothing to compare")
    g = torch.Generator().manual_seed(0)
    torch_q = [quantize_int4(torch.randn(n, k, generator=g)) for n, k in SHAPES]
    ours = [quantize_int4(torch.randn(n, k, generator=g)) for n, k in SHAPES]
    scratch = DequantScratch(ops)
    for q in ours:
        q.use_native(ops)
        q.scratch = scratch
    iters = 2 if args.quick else args.iters
    rows_list = [int(r) for r in args.rows.split(",")]
    table, out = [], []
    for rows in rows_list:
        xs = [torch.randn(rows, k, generator=g).to(torch.bfloat16) for _, k in SHAPES]

        def timer(fn) -> Any:
            def go(_: int) -> float:
                t0 = time.perf_counter()
                for _ in range(iters):
                    for i in range(len(SHAPES)):
                        fn(i)
                return (time.perf_counter() - t0) / iters * LAYERS * 1e3

            return go

        variants = {
            "torch_int4": timer(
                lambda i, xs=xs: torch.ops.aten._weight_int4pack_mm_for_cpu(
                    xs[i], torch_q[i].packed, GROUP, torch_q[i].scale_zero
                )
            ),
            "q4_linear": timer(
                lambda i, xs=xs: ops.q4_linear(xs[i], ours[i].tiles, ours[i].scale_low, SHAPES[i][0])
            ),
            "dequant_dense": timer(lambda i, xs=xs: xs[i] @ ours[i].dequantize(torch.bfloat16).t()),
        }
        times = interleave(variants, reps(args), warmup=True)
        ms = {k: median(v) for k, v in times.items()}
        out.append(
            {"rows": rows, "ms_all_layers": ms, "torch_int4_vs_q4_linear": ms["torch_int4"] / ms["q4_linear"]}
        )
        table.append(
            [rows, ms["torch_int4"], ms["q4_linear"], ms["dequant_dense"], ms["torch_int4"] / ms["q4_linear"]]
        )
    print(format_table(["rows", "torch int4 ms", "q4_linear ms", "dequant+dense ms", "torch / ours"], table))
    return {"shapes": SHAPES, "layers": LAYERS, "results": out}


def main(argv: list[str] | None = None) -> int:
    return bench_main("q4_linear", parse_args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
