"""Gated DeltaNet: the linear-attention layer of Qwen3.5 and Qwen3-Next, over a per-request state pool.

A sequence's layer state is a recurrent matrix per value head (fp32) plus the last ``kernel - 1``
inputs of the short causal convolution; both live in one slot of ``runtime/runner/state_pool.py`` and
carry over from one chunk (or decode step) of the request to the next.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from kernels.gated_delta import causal_conv1d, causal_conv1d_step
from kernels.linear_attention import LinearAttnBackend, chunk_with_captures
from runtime.models.hybrid_config import LinearAttnConfig
from runtime.models.linear import Linear


class StateBatch(NamedTuple):
    """What the linear layers of one forward share.

    ``slots[i]``: sequence i's slot in the state pool; ``fresh[i]``: it starts at token 0 (zero state).
    ``cuts[i]``: offsets inside sequence i's chunk (0 < c < len) whose states are captured, in order,
    into ``captures`` (conv ``[lin_layers, C, K-1]``, rec ``[lin_layers, Hv, Dk, Dv]`` each).
    """

    backend: LinearAttnBackend
    slots: torch.Tensor
    fresh: torch.Tensor
    cu_seqlens: list[int]
    cuts: list[list[int]]
    captures: list[tuple[torch.Tensor, torch.Tensor]]


class GatedRMSNorm(nn.Module):
    """Per-head RMSNorm of the attention output, multiplied by SiLU of the gate ``z`` (in fp32)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return ((self.weight * x32.to(dtype)) * F.silu(gate.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    """in-projection (q, k, v, z, b, a fused) -> short conv -> gated delta rule -> gated norm -> out."""

    def __init__(self, lc: LinearAttnConfig, hidden: int, eps: float, index: int) -> None:
        super().__init__()
        self.lc, self.index = lc, index  # index among the linear layers: row of the state pool
        nv = lc.num_v_heads
        self.splits = [lc.conv_dim, lc.value_dim, nv, nv]
        self.in_proj = Linear(hidden, sum(self.splits), bias=False)
        self.conv_weight = nn.Parameter(torch.empty(lc.conv_dim, lc.conv_kernel))
        self.dt_bias = nn.Parameter(torch.ones(nv))
        self.A_log = nn.Parameter(torch.zeros(nv))
        self.norm = GatedRMSNorm(lc.v_head_dim, eps)
        self.out_proj = Linear(lc.value_dim, hidden, bias=False)

    def forward(
        self, x: torch.Tensor, sb: StateBatch, state: tuple[torch.Tensor, torch.Tensor], is_decode: bool
    ) -> torch.Tensor:
        lc = self.lc
        mixed, z, b, a = self.in_proj.run(x).split(self.splits, dim=-1)
        conv_buf, rec_buf = state
        keep = (~sb.fresh).to(conv_buf.dtype)
        conv0 = conv_buf.index_select(0, sb.slots) * keep[:, None, None]
        rec0 = rec_buf.index_select(0, sb.slots) * keep.to(rec_buf.dtype)[:, None, None, None]
        if is_decode:
            y, conv1 = causal_conv1d_step(mixed, self.conv_weight, conv0)
        else:
            y, conv1 = causal_conv1d(mixed, self.conv_weight, sb.cu_seqlens, conv0)
        q, k, v = y.split([lc.key_dim, lc.key_dim, lc.value_dim], dim=-1)
        q = q.reshape(-1, lc.num_k_heads, lc.k_head_dim)
        k = k.reshape(-1, lc.num_k_heads, lc.k_head_dim)
        v = v.reshape(-1, lc.num_v_heads, lc.v_head_dim)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        if is_decode:
            o, rec1 = sb.backend.step(q, k, v, g, beta, rec0)
        else:
            o, rec1, caught = chunk_with_captures(
                sb.backend.chunk, q, k, v, g, beta, sb.cu_seqlens, rec0, sb.cuts
            )
            if caught:
                self._store_captures(mixed, conv0, sb, caught)
        conv_buf.index_copy_(0, sb.slots, conv1.to(conv_buf.dtype))
        rec_buf.index_copy_(0, sb.slots, rec1.to(rec_buf.dtype))
        o = self.norm.forward(o, z.reshape(-1, lc.num_v_heads, lc.v_head_dim))
        return self.out_proj.run(o.reshape(-1, lc.value_dim))

    def _store_captures(
        self, mixed: torch.Tensor, conv0: torch.Tensor, sb: StateBatch, caught: list[torch.Tensor]
    ) -> None:
        """Write this layer's state at every cut into its capture: the recurrent state and the conv window."""
        width = self.lc.conv_kernel - 1
        m = 0
        for i, cuts in enumerate(sb.cuts):
            if not cuts:
                continue
            s, e = sb.cu_seqlens[i], sb.cu_seqlens[i + 1]
            xp = torch.cat([conv0[i], mixed[s:e].t().to(conv0.dtype)], dim=-1)  # [C, K-1+len]
            for c in cuts:
                conv, rec = sb.captures[m]
                conv[self.index].copy_(xp[:, c : c + width])
                rec[self.index].copy_(caught[m])
                m += 1
