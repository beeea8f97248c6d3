"""Gated DeltaNet: the linear-attention layer of Qwen3.5 and Qwen3-Next, over a per-request state pool.

A sequence's layer state is a recurrent matrix per value head (fp32) plus the last ``kernel - 1``
inputs of the short causal convolution; both live in one slot of ``runtime/runner/state_pool.py`` and
carry over from one chunk (or decode step) of the request to the next.

A sequence that verifies a speculative draft runs its last token and the draft as one chunk; the
forward leaves the state after the whole chunk in its slot and keeps (``VerifyStash``) the state it
started from and this layer's inputs at those tokens, so that once the accepted count is known
``replay`` rebuilds the state after the accepted prefix (``runtime/cache/state_slots.py``'s
``settle``).  Replaying the inputs rather than keeping a state per drafted position: the kept start
state is the copy the forward already makes (``index_select``), nothing is kept per position (a
state is ``[Hv, Dk, Dv]`` fp32 per layer, and a draft has up to 16 positions), and nothing runs
when the whole draft is accepted; a rejection costs one varlen call of the delta rule per layer
over the accepted prefixes, no projections and no MLP (a layer's inputs at accepted tokens do not
depend on what followed them).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from kvreuse.kernels.gated_delta import causal_conv1d, causal_conv1d_step
from kvreuse.kernels.linear_attention import LinearAttnBackend, chunk_with_captures
from kvreuse.runtime.models.hybrid_config import LinearAttnConfig
from kvreuse.runtime.models.linear import Linear


class VerifyInputs(NamedTuple):
    """One linear layer at the tokens of a step's verifying sequences: the state they started from
    (conv ``[N, C, K-1]``, rec ``[N, Hv, Dk, Dv]``), the conv's input ``mixed`` and the delta rule's
    inputs, sequence j's at rows ``cu[j]:cu[j+1]``; ``chunk``: the kernel the forward ran."""

    chunk: Callable
    conv0: torch.Tensor
    rec0: torch.Tensor
    mixed: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    cu: list[int]


class VerifyStash(NamedTuple):
    """A step's sequences that verify a draft (``rows``: their indices in the batch) and, filled by the
    forward, each linear layer's ``VerifyInputs`` (``layers[index]``)."""

    rows: list[int]
    layers: dict[int, VerifyInputs]


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
    verify: VerifyStash | None = None


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
        if sb.verify is not None and sb.verify.rows:  # before the kernel, which may reuse rec0's memory
            sb.verify.layers[self.index] = _stash(sb, conv0, rec0, mixed, q, k, v, g, beta)
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


def _stash(sb: StateBatch, conv0: torch.Tensor, rec0: torch.Tensor, *per_token: torch.Tensor) -> VerifyInputs:
    """The verifying sequences' start states and ``mixed, q, k, v, g, beta`` at their tokens."""
    assert sb.verify is not None
    rows, cu = sb.verify.rows, sb.cu_seqlens
    idx = torch.cat([torch.arange(cu[r], cu[r + 1]) for r in rows]).to(conv0.device)
    sel = torch.tensor(rows, device=conv0.device)
    lengths = [cu[r + 1] - cu[r] for r in rows]
    return VerifyInputs(
        sb.backend.chunk, conv0.index_select(0, sel), rec0.index_select(0, sel),
        *(x.index_select(0, idx) for x in per_token), [0, *accumulate(lengths)],
    )  # fmt: skip


def replay(
    inp: VerifyInputs, which: list[int], lengths: list[int], cuts: list[list[int]]
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The states of verifying sequences ``which`` after the first ``lengths[j]`` tokens of their
    chunks (conv ``[n, C, K-1]``, rec ``[n, Hv, Dk, Dv]``), and (conv, rec) at each of ``cuts[j]``
    (offsets inside those prefixes), in order."""
    dev = inp.q.device
    idx = torch.cat([torch.arange(inp.cu[j], inp.cu[j] + m) for j, m in zip(which, lengths)]).to(dev)
    sel = torch.tensor(which, device=dev)
    x = [t.index_select(0, idx) for t in (inp.q, inp.k, inp.v, inp.g, inp.beta)]
    _, rec, caught = chunk_with_captures(
        inp.chunk, *x, [0, *accumulate(lengths)], inp.rec0.index_select(0, sel), cuts
    )
    width = inp.conv0.shape[-1]
    convs, at = [], []
    for j, m, cs in zip(which, lengths, cuts):
        s = inp.cu[j]
        xp = torch.cat([inp.conv0[j], inp.mixed[s : s + m].t().to(inp.conv0.dtype)], dim=-1)  # [C, K-1+m]
        convs.append(xp[:, m : m + width])
        at += [xp[:, c : c + width] for c in cs]
    return torch.stack(convs), rec, list(zip(at, caught))
