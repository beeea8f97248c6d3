"""gpt-oss's MXFP4 experts kept quantized: the checkpoint's blocks and scales, decoded per active expert.

MXFP4 (OCP microscaling): each run of 32 weights along an expert row shares one power-of-two scale
(``scales``: a uint8 exponent, bias 127) and each weight is a 4-bit e2m1 float, two to a byte, the low
nibble first (``blocks``).  That is 4.25 bits a weight against 16 in bf16.  ``Mxfp4Experts`` keeps both
tensors as loaded (rows de-interleaved into our gate | up order, no dense copy) and, for a step, decodes
only the experts some token picked: one gather from a 256-entry byte -> (lo, hi) table, one multiply by
the block scales, exact in fp32 and bf16 (every value is a small integer times a power of two), then the
expert's two matmuls.  On CPU, when no expert has more than ``mxfp4_cpu.MAX_ROWS`` rows (decode), no
expert is decoded at all: ``kernels/cpu/mxfp4.c`` multiplies straight from the blocks, one call for every
picked expert's gate_up and one for its down; fp32 activations in fp32 (exact products), bf16 / fp16 ones
quantized to int8 per block of 32 and multiplied as integers (``mxfp4_cpu.q8_error_bound``).  The values
equal transformers' dequantization (``integrations/mxfp4.py: convert_moe_packed_tensors``;
``tests/test_gpt_oss_mxfp4.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from kvreuse.kernels import mxfp4_cpu
from kvreuse.runtime.models.moe import Experts, group_by_expert
from kvreuse.runtime.models.moe_gather import Glu

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCK = 32  # weights per scale


def byte_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """``[256, 2]`` fp32: a packed byte's (low nibble, high nibble) values."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=device)
    b = torch.arange(256, device=device)
    return torch.stack((lut[b & 15], lut[b >> 4]), dim=1)


def dequantize(
    blocks: torch.Tensor, scales: torch.Tensor, table: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``blocks [..., out, in/2]`` uint8 and ``scales [..., out, in/32]`` uint8 -> ``[..., out, in]``."""
    *lead, out, half = blocks.shape
    w = table[blocks.long()].view(*lead, out, half * 2 // BLOCK, BLOCK)
    w = w * torch.exp2(scales.float() - 127).unsqueeze(-1)
    return w.view(*lead, out, half * 2).to(dtype)


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [..., out, in]`` -> blocks ``[..., out, in/32, 16]`` and scales ``[..., out, in/32]``, the
    checkpoint layout: each block's scale is the smallest power of two that brings it within +-6,
    each weight the nearest e2m1 value (how a test or benchmark makes an MXFP4 checkpoint)."""
    *lead, out, n = w.shape
    wb = w.float().reshape(*lead, out, n // BLOCK, BLOCK)
    exp = torch.ceil(torch.log2(wb.abs().amax(-1).clamp(min=2.0**-126) / 6.0)).clamp(-127, 127)
    q = (wb / torch.exp2(exp).unsqueeze(-1)).contiguous()
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device=w.device)
    idx = (torch.bucketize(q.abs(), mids) + 8 * (q < 0)).to(torch.uint8)
    return idx[..., 0::2] | (idx[..., 1::2] << 4), (exp + 127).to(torch.uint8)


class Mxfp4Experts(Experts):
    """``Experts`` whose matrices stay MXFP4: ``gate_up_proj_blocks [E, 2I, H/2]`` + ``_scales
    [E, 2I, H/32]``, ``down_proj_blocks [E, H, I/2]`` + ``_scales [E, H, I/32]`` (uint8), biases as
    ``Experts``'.  Every step takes the grouped per-expert path, decoding each active expert once."""

    def __init__(self, num_experts: int, hidden: int, inter: int, glu: Glu, bias: bool = True) -> None:
        nn.Module.__init__(self)  # not Experts': no dense matrices
        if hidden % BLOCK or inter % BLOCK:
            raise ValueError(f"MXFP4 experts need hidden ({hidden}) and width ({inter}) divisible by {BLOCK}")
        self.num_experts, self.hidden, self.inter, self.glu = num_experts, hidden, inter, glu
        u8 = {"dtype": torch.uint8}
        self.gate_up_proj_blocks = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden // 2, **u8), False)
        self.gate_up_proj_scales = nn.Parameter(
            torch.empty(num_experts, 2 * inter, hidden // BLOCK, **u8), False
        )
        self.down_proj_blocks = nn.Parameter(torch.empty(num_experts, hidden, inter // 2, **u8), False)
        self.down_proj_scales = nn.Parameter(torch.empty(num_experts, hidden, inter // BLOCK, **u8), False)
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * inter)) if bias else None
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden)) if bias else None
        self._table: torch.Tensor | None = None
        self._kernel = mxfp4_cpu.load()  # None: decode with torch

    def pack_for_cpu(self) -> bool:
        """Nothing to re-lay out: the blocks are read as loaded."""
        return False

    def gathers_rows(self) -> bool:
        return False

    def forward(self, x: torch.Tensor, top_i: torch.Tensor, top_w: torch.Tensor) -> torch.Tensor:
        g = group_by_expert(top_i, top_w)
        xs = x.index_select(0, g.token)
        ids, counts = torch.unique_consecutive(g.expert, return_counts=True)
        mm = self._kernel if x.device.type == "cpu" and int(counts.max()) <= mxfp4_cpu.MAX_ROWS else None
        if mm is None:
            ys = self._swiglu_rows(list(xs.split(counts.tolist())), ids.tolist(), g.expert)
            return torch.zeros_like(x).index_add_(0, g.token, ys * g.weight.unsqueeze(1))
        # one kernel call for every picked expert's gate_up, one for its down
        gu = mm(xs, counts, ids, self.gate_up_proj_blocks, self.gate_up_proj_scales).to(x.dtype)
        h = self.glu(gu + _bias_rows(self.gate_up_proj_bias, g.expert))
        y = mm(h, counts, ids, self.down_proj_blocks, self.down_proj_scales).to(x.dtype)
        y = y + _bias_rows(self.down_proj_bias, g.expert)
        return torch.zeros_like(x).index_add_(0, g.token, y * g.weight.unsqueeze(1))

    def expert(self, e: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert ``e``'s ``gate_up [2I, H]`` and ``down [H, I]``, decoded."""
        if self._table is None or self._table.device != self.gate_up_proj_blocks.device:
            self._table = byte_table(self.gate_up_proj_blocks.device)
        t = self._table
        return (
            dequantize(self.gate_up_proj_blocks[e], self.gate_up_proj_scales[e], t, dtype),
            dequantize(self.down_proj_blocks[e], self.down_proj_scales[e], t, dtype),
        )


def _bias_rows(bias: torch.Tensor | None, expert: torch.Tensor) -> torch.Tensor | float:
    """Each row's expert's bias (rows grouped by expert), or 0 without biases."""
    return 0.0 if bias is None else bias.index_select(0, expert)
