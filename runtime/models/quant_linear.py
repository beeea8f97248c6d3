"""Weight-only quantized linears for CPU: int4 (groups of 32, scale + zero) and int8 (per output channel).

Decode multiplies a handful of rows by every weight, so it is bound by the bytes it streams; int4
streams a quarter of bf16's.  Measured on the 2-core AVX512-BF16 host (SmolLM2-135M layer shapes, 30
layers cycled, 1 thread, machine loaded), ms for all layers, oneDNN-packed dense bf16 -> torch's
packed CPU kernels:

=======  ===============  ================  ==============
rows     dense bf16       int4 (bf16 act)   int8 (bf16 act)
=======  ===============  ================  ==============
1        58.5             14.9              56.7
8        109              103               153
64       664              1502              -
512      4807             12360             -
=======  ===============  ================  ==============

torch's int4 kernel costs nearly a row's time per row, so verifying a speculative draft of k tokens
cost ~k decode steps.  Where the CPU kernels build (``QuantLinear.use_native``), int4 rows up to
``Q4_ROWS`` go instead to ``kernels/cpu/q4_linear.c``, which unpacks each weight block once for all
rows (int8 activations per block of 32, as llama.cpp's Q4_1 x Q8_1) and gives each row the same bits
whatever the row count.  ``benchmarks/kernels/q4_linear.py`` (``results/q4_linear.json``; same shapes, 1
thread, bf16 rows, the three paths interleaved; on a host loaded ~4 by other work, so single figures
varied up to 2.5x between runs, the ratios less), ms for all layers:

=======  ==================  ==============  ================
rows     torch int4 kernel   q4_linear.c     dequant + dense
=======  ==================  ==============  ================
1        7.74                2.82            40.5
4        11.9                4.44            34.4
8        58.2                9.86            98.9
16       87.5                50.5            102
17       77.5                29.1            108
=======  ==================  ==============  ================

With fp32 activations torch's kernels fall back to slow generic code (int4: 657 ms for 1 row), so
they always take bf16 activations and bf16 scales/zeros.  Above ``_KERNEL_ROWS`` rows
(prefill) the weight is dequantized to the activation dtype for the call and multiplied densely:
dequantizing costs a few elementwise passes over the weight, a 512-row GEMM costs 512 times its size.
torchao is not installed here and wraps these same kernels on CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvreuse.kernels.native_cpu import Q4_ROWS, NativeOps

GROUP = 32  # GGUF's block size for Q4_0 / Q4_1 and Q4_K's sub-blocks
_KERNEL_ROWS = {"int4": 8, "int8": 1}  # at most this many rows go through the packed kernel


class QuantLinear(nn.Module):
    """``y = x W^T (+ b)`` with W kept as int4 groups or int8 rows; see the module docstring.

    int4: ``W[n, k] = (q[n, k] - 8) * scale[n, k // 32] + zero[n, k // 32]``, ``q`` in 0..15.
    int8: ``W[n, k] = q[n, k] * scale[n]``, ``q`` in -127..127.
    """

    def __init__(self, kind: str, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
                 bias: torch.Tensor | None) -> None:  # fmt: skip
        super().__init__()
        self.kind = kind
        self.out_features, self.in_features = codes.shape
        self.bias = None if bias is None else bias.to(torch.bfloat16)
        self.kernel_rows = _KERNEL_ROWS[kind]
        if kind == "int4":
            n, k = codes.shape
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
            # [k // 32, n, 2] as the kernel wants
            self.scale_zero = torch.stack((scale.t(), zero.t()), -1).to(torch.bfloat16).contiguous()
            # the dense fallback: two codes a byte (j and j + 16 of a group), and the same bf16 grid
            g = codes.view(n, k // GROUP, GROUP).to(torch.uint8)
            self.codes = (g[..., : GROUP // 2] | (g[..., GROUP // 2 :] << 4)).contiguous()
            s, z = self.scale_zero.unbind(-1)
            self.scale = s.t().contiguous()[..., None]
            self.low = (z.float() - 8 * s.float()).to(torch.bfloat16).t().contiguous()[..., None]
        else:
            self.codes = codes.to(torch.int8).contiguous()
            self.scale = scale.to(torch.bfloat16).contiguous()
        self.native: NativeOps | None = None  # int4 rows <= Q4_ROWS through kernels/cpu/q4_linear.c

    def use_native(self, ops: NativeOps | None) -> None:
        """Multiply int4 rows (up to ``Q4_ROWS``) with ``q4_linear.c`` instead of torch's packed kernel,
        whose cost grows with every row: a speculative draft's verification then costs about a decode
        step instead of one per drafted token.  The weight is re-laid out in the kernel's tiles of 16
        output columns (the same codes and bf16 scale / low), and torch's packed copy is dropped."""
        if ops is None or self.kind != "int4":
            return
        n, k = self.out_features, self.in_features
        tiles = (n + 15) // 16
        q = torch.cat((self.codes & 15, self.codes >> 4), -1).view(n, k)  # codes 0..15 in input order
        q = F.pad(q, (0, 0, 0, tiles * 16 - n)).view(tiles, 16, k // GROUP, 4, 2, 4)
        # [tile, block, group of 8 inputs, output, 4 bytes]: inputs 8g + j (low nibble), 8g + 4 + j (high)
        q = q.permute(0, 2, 3, 1, 4, 5)
        self.tiles = (q[..., 0, :] | (q[..., 1, :] << 4)).contiguous()
        sl = torch.stack((self.scale[..., 0], self.low[..., 0]))  # [2, n, blocks]
        sl = F.pad(sl, (0, 0, 0, tiles * 16 - n)).view(2, tiles, 16, k // GROUP)
        self.scale_low = sl.permute(1, 3, 0, 2).contiguous()  # [tile, block, scale | low, output]
        self.native, self.kernel_rows, self.packed = ops, Q4_ROWS, None

    scratch: DequantScratch | None = None  # shared by a model's quantized linears (quantize.py sets it)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight ``[out, in]`` these codes stand for (in bf16 scale precision), as ``dtype``.

        In place on one tensor (the shared scratch when there is one): a fused op allocating its own
        output was up to 10x slower here (page faults on every multi-MB allocation).
        """
        n, k = self.out_features, self.in_features
        w = torch.empty(n, k, dtype=dtype) if self.scratch is None else self.scratch.take(n * k, dtype)
        ops = None if self.scratch is None else self.scratch.ops
        if ops is not None and ops.supports(w):  # the same values in one pass (kernels/cpu/dequant.c)
            ops.dequantize(self.codes, self.scale, self.low if self.kind == "int4" else None, w.view(n, k))
            return w.view(n, k)
        if self.kind == "int8":
            return w.view(n, k).copy_(self.codes).mul_(self.scale.to(dtype)[:, None])
        g = w.view(n, k // GROUP, 2, GROUP // 2)
        g[:, :, 0].copy_(self.codes & 15)
        g[:, :, 1].copy_(self.codes >> 4)
        w = w.view(n, k // GROUP, GROUP)
        return w.mul_(self.scale.to(dtype)).add_(self.low.to(dtype)).view(n, k)

    def run(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.kernel_rows:
            return F.linear(x, self.dequantize(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        if self.native is not None:
            xn = x if self.native.supports(x) else x.to(torch.bfloat16)
            y = self.native.q4_linear(xn, self.tiles, self.scale_low, self.out_features)
            y = y if self.bias is None else y + self.bias.to(y.dtype)
            return y if y.dtype == x.dtype else y.to(x.dtype)
        xb = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)
        if self.kind == "int4":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.packed, GROUP, self.scale_zero)
        else:
            y = torch.ops.aten._weight_int8pack_mm(xb, self.codes, self.scale)
        if self.bias is not None:
            y = y + self.bias
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x)


class DequantScratch:
    """One reusable buffer a model's quantized linears dequantize into for a prefill matmul, in turn.

    Dequantizing into a fresh multi-MB tensor per linear per forward costs allocator and page-fault
    time on top of the arithmetic; one buffer, as large as the largest weight, is reused instead.
    Each weight is consumed by its matmul before the next linear overwrites the buffer.  ``ops``
    (``kvreuse.kernels.native_cpu.NativeOps``, when the CPU kernels build) dequantizes in one pass instead
    of four torch ops (~3 -> ~0.3 ms a layer of the embedded model), with the same rounding.
    """

    def __init__(self, ops: NativeOps | None = None) -> None:
        self.buffers: dict[torch.dtype, torch.Tensor] = {}
        self.ops = ops

    def take(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        buf = self.buffers.get(dtype)
        if buf is None or buf.numel() < numel:
            buf = self.buffers[dtype] = torch.empty(numel, dtype=dtype)
        return buf[:numel]


def int4_codes(w: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """Codes 0..15 of ``w [n, k]`` on a known grid ``low + scale * q`` per group of 32 (exact for GGUF)."""
    n, k = w.shape
    s = scale[..., None]
    q = torch.where(s > 0, (w.view(n, k // GROUP, GROUP) - low[..., None]) / s.clamp(min=1e-30), 0.0)
    return q.round().clamp(0, 15).to(torch.uint8).view(n, k)


def quantize_int4(w: torch.Tensor, bias: torch.Tensor | None = None) -> QuantLinear:
    """Asymmetric min/max int4 per group of 32 (for dense weights: ``--quantize int4``)."""
    n, k = w.shape
    g = w.float().view(n, k // GROUP, GROUP)
    low, high = g.amin(-1), g.amax(-1)
    scale = (high - low) / 15
    return int4_from_grid(w.float(), scale, low, bias)


def int4_from_grid(
    w: torch.Tensor, scale: torch.Tensor, low: torch.Tensor, bias: torch.Tensor | None
) -> QuantLinear:
    """int4 linear for weights that lie on ``low + scale * q`` (GGUF Q4_0 / Q4_1 / Q4_K)."""
    return QuantLinear("int4", int4_codes(w, scale, low), scale, low + 8 * scale, bias)


def quantize_int8(w: torch.Tensor, bias: torch.Tensor | None = None) -> QuantLinear:
    """Symmetric int8 per output channel (``--quantize int8``; GGUF Q8_0 / Q6_K are requantized)."""
    w = w.float()
    scale = w.abs().amax(1).clamp(min=1e-12) / 127
    codes = (w / scale[:, None]).round().clamp(-127, 127)
    return QuantLinear("int8", codes, scale, None, bias)
