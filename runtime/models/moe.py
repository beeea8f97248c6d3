"""Sparse mixture-of-experts feed-forward: a softmax top-k router over SwiGLU experts.

Qwen3-MoE has routed experts only; Qwen3-Next and Qwen3.5-MoE add one shared expert whose output
is scaled by a sigmoid gate.  Expert weights are stored fused, ``gate_up_proj [E, 2I, H]`` and
``down_proj [E, H, I]`` (transformers 5.x's in-memory layout), so a GPU grouped GEMM reads them as
one tensor.

Execution groups the ``T * top_k`` token-expert assignments by expert (a stable sort), runs one
SwiGLU per *active* expert over its contiguous rows and scatter-adds the weighted results back to
their tokens.  Decode therefore reads only the weights of experts some token picked, and a batch of
streams reads each picked expert once for all the rows routed to it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from runtime.models.layers import GatedMLP
from runtime.models.linear import Linear, onednn_packs
from runtime.models.moe_config import MoEConfig


class Grouping(NamedTuple):
    """Token-expert assignments sorted by expert: row ``i`` of the grouped batch is token ``token[i]``."""

    token: torch.Tensor  # [T*K] int64, source row of each grouped row
    weight: torch.Tensor  # [T*K] routing weight of each grouped row
    counts: torch.Tensor  # [E] int64, grouped rows per expert (contiguous, in expert order)


def route(logits: torch.Tensor, top_k: int, normalise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax (fp32) over experts, top-k, optionally renormalised: ``(weights [T,K], experts [T,K])``.

    Mirrors transformers' Qwen3-MoE router step for step so ties and rounding pick the same experts.
    """
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    top_w, top_i = torch.topk(probs, top_k, dim=-1)
    if normalise:
        top_w /= top_w.sum(dim=-1, keepdim=True)
    return top_w.to(logits.dtype), top_i


def group_by_expert(top_i: torch.Tensor, top_w: torch.Tensor, num_experts: int) -> Grouping:
    """Sort assignments by expert; counts come from a scatter-add so no step waits on the device."""
    flat = top_i.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    return Grouping(order // top_i.shape[1], top_w.reshape(-1)[order], counts)


class Experts(nn.Module):
    """The routed experts of one layer, fused; on CPU each expert's two matrices are packed for oneDNN."""

    packed: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def __init__(self, num_experts: int, hidden: int, inter: int) -> None:
        super().__init__()
        self.num_experts, self.hidden, self.inter = num_experts, hidden, inter
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, inter))

    def pack_for_cpu(self) -> bool:
        """Replace the fused tensors by one oneDNN-packed pair per expert (one copy in memory).

        Decode multiplies a handful of rows by each active expert, the regime where the packed layout
        streams weights faster (see ``runtime/models/linear.py``).
        """
        if self.gate_up_proj is None or not onednn_packs(self.gate_up_proj):
            return False
        reorder = torch.ops.mkldnn._reorder_linear_weight
        self.packed = [
            (reorder(self.gate_up_proj[e].detach()), reorder(self.down_proj[e].detach()))
            for e in range(self.num_experts)
        ]
        self.gate_up_proj = None
        self.down_proj = None
        return True

    def forward(self, x: torch.Tensor, g: Grouping) -> torch.Tensor:
        """``x [T, H]`` -> ``[T, H]``: each token's routing-weighted sum over its experts."""
        xs = x.index_select(0, g.token)
        if x.is_cuda:
            from kernels.triton_moe import grouped_swiglu  # Triton only where it can compile

            ys = grouped_swiglu(xs, self.gate_up_proj, self.down_proj, g.counts)
        else:
            ys = self._per_expert(xs, g.counts.tolist())
        ys = ys * g.weight.unsqueeze(1)
        return torch.zeros_like(x).index_add_(0, g.token, ys)

    def _per_expert(self, xs: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """One SwiGLU per active expert over its contiguous rows of ``xs``."""
        out = torch.empty_like(xs)
        start = 0
        for e, n in enumerate(counts):
            if not n:
                continue
            rows = slice(start, start + n)
            start += n
            if self.packed is not None:
                gate_up, down = self.packed[e]
                gu = torch.ops.mkldnn._linear_pointwise(xs[rows], gate_up, None, "none", [], "")
                h = _swiglu(gu, self.inter)
                out[rows] = torch.ops.mkldnn._linear_pointwise(h, down, None, "none", [], "")
            else:
                h = _swiglu(F.linear(xs[rows], self.gate_up_proj[e]), self.inter)
                out[rows] = F.linear(h, self.down_proj[e])
        return out


def _swiglu(gate_up: torch.Tensor, inter: int) -> torch.Tensor:
    return F.silu(gate_up[:, :inter]) * gate_up[:, inter:]


class SparseMoE(nn.Module):
    """Router + routed experts (+ an optional shared expert behind a sigmoid gate).

    Parameter names follow the HF checkpoints (``mlp.gate``, ``mlp.experts``, ``mlp.shared_expert``,
    ``mlp.shared_expert_gate``), so most weights load by name.
    """

    def __init__(self, hidden: int, moe: MoEConfig) -> None:
        super().__init__()
        self.top_k, self.normalise, self.num_experts = moe.top_k, moe.norm_topk_prob, moe.num_experts
        self.gate = Linear(hidden, moe.num_experts, bias=False)
        self.experts = Experts(moe.num_experts, hidden, moe.expert_intermediate_size)
        self.shared_expert: GatedMLP | None = None
        self.shared_expert_gate: Linear | None = None
        if moe.shared_expert_intermediate_size:
            self.shared_expert = GatedMLP(hidden, moe.shared_expert_intermediate_size)
            self.shared_expert_gate = Linear(hidden, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top_w, top_i = route(self.gate.run(x), self.top_k, self.normalise)
        out = self.experts.forward(x, group_by_expert(top_i, top_w, self.num_experts))
        if self.shared_expert is not None:
            shared = self.shared_expert.forward(x)
            out = out + torch.sigmoid(self.shared_expert_gate.run(x)) * shared
        return out


def feed_forward(hidden: int, intermediate: int, moe: MoEConfig | None, layer: int) -> nn.Module:
    """Layer ``layer``'s feed-forward: the MoE block where the config makes it sparse, else dense SwiGLU."""
    if moe is not None and moe.is_sparse(layer):
        return SparseMoE(hidden, moe)
    return GatedMLP(hidden, intermediate)
