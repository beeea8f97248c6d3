"""A linear kept as GGUF ``Q8_0`` blocks (int8 codes, one scale per 32), for the LM head.

The head of a small model is the largest single matmul of a decode step: SmolLM2-135M's tied
49152 x 576 head is 56 MB in bf16 (3.4 ms of a ~13 ms step on 2 threads), 30 MB as the GGUF's own
Q8_0 blocks.  Unlike torch's per-row int8 kernel (no faster than packed bf16 here), the fused CPU
kernels (``kernels/cpu/q8_linear.c``) read those blocks (re-laid out, not re-rounded), so the codes
and scales are the file's exactly.  Many rows (prompt scoring) dequantize once and multiply densely.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvreuse.kernels.native_cpu import NativeOps

# at most this many rows go through the block kernel (each row's result independent of the others):
# a speculative verification's rows (up to a 16-token draft and its first token) included
KERNEL_ROWS = 32


class BlockInt8Linear(nn.Module):
    """``y = x W^T`` with ``W[n, 32 b + i] = codes[n, 32 b + i] * scales[n, b]`` (no bias).

    With the CPU kernels the blocks are kept only in ``q8_tiles``' layout (tiles of 16 outputs, codes
    + 128 as bytes, 16 scales a tile and block): verifying a draft's 17 rows then costs a few rows of
    ``q8_linear`` instead of 17.
    """

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, ops: NativeOps | None) -> None:
        super().__init__()
        codes, scales = codes.to(torch.int8), scales.float()
        self.out_features, self.in_features = codes.shape
        self.ops = ops
        if ops is None:
            self.codes, self.scales = codes.contiguous(), scales.contiguous()
            return
        n, k = codes.shape
        tiles, pad = (n + 15) // 16, -n % 16
        c = (F.pad(codes, (0, 0, 0, pad)).to(torch.int16) + 128).to(torch.uint8)
        # [tile, block, group of 4 inputs, output, 4 bytes]
        self.tiles = c.view(tiles, 16, k // 32, 8, 4).permute(0, 2, 3, 1, 4).contiguous()
        self.tile_scales = F.pad(scales, (0, 0, 0, pad)).view(tiles, 16, k // 32).transpose(1, 2).contiguous()

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(int8 codes ``[n, k]``, fp32 scales ``[n, k / 32]``), from the tiles when only they are kept."""
        if self.ops is None:
            return self.codes, self.scales
        n, k = self.out_features, self.in_features
        codes = (self.tiles.permute(0, 3, 1, 2, 4).reshape(-1, k)[:n].to(torch.int16) - 128).to(torch.int8)
        return codes, self.tile_scales.transpose(1, 2).reshape(-1, k // 32)[:n]

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        codes, scales = self.blocks()
        n, k = codes.shape
        w = codes.view(n, k // 32, 32).to(torch.float32) * scales[..., None]
        return w.view(n, k).to(dtype)

    def run(self, x: torch.Tensor) -> torch.Tensor:
        if self.ops is not None and x.shape[0] <= KERNEL_ROWS and self.ops.supports(x):
            return self.ops.q8_tiles(x, self.tiles, self.tile_scales, self.out_features)
        return F.linear(x, self.dequantize(x.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x)
