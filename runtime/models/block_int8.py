"""A linear kept as GGUF ``Q8_0`` blocks (int8 codes, one scale per 32), for the LM head.

The head of a small model is the largest single matmul of a decode step: SmolLM2-135M's tied
49152 x 576 head is 56 MB in bf16 (3.4 ms of a ~13 ms step on 2 threads), 30 MB as the GGUF's own
Q8_0 blocks.  Unlike torch's per-row int8 kernel (no faster than packed bf16 here), the fused CPU
kernel ``q8_linear`` (``kernels/cpu/q8_linear.c``) reads those blocks as they are, so the codes and
scales are the file's exactly.  Many rows (prompt scoring) dequantize once and multiply densely.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.native_cpu import NativeOps

KERNEL_ROWS = 8  # at most this many rows go through the block kernel


class BlockInt8Linear(nn.Module):
    """``y = x W^T`` with ``W[n, 32 b + i] = codes[n, 32 b + i] * scales[n, b]`` (no bias)."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, ops: NativeOps | None) -> None:
        super().__init__()
        self.codes = codes.to(torch.int8).contiguous()
        self.scales = scales.float().contiguous()
        self.out_features, self.in_features = self.codes.shape
        self.ops = ops

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        n, k = self.codes.shape
        w = self.codes.view(n, k // 32, 32).to(torch.float32) * self.scales[..., None]
        return w.view(n, k).to(dtype)

    def run(self, x: torch.Tensor) -> torch.Tensor:
        if self.ops is not None and x.shape[0] <= KERNEL_ROWS and self.ops.supports(x):
            return self.ops.q8_linear(x, self.codes, self.scales)
        return F.linear(x, self.dequantize(x.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x)
