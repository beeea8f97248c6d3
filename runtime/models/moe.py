"""Sparse mixture-of-experts feed-forward: a softmax top-k router over SwiGLU experts (gpt-oss and
Gemma 4 bring their own routers and activations).

Qwen3-MoE has routed experts only; Qwen3-Next and Qwen3.5-MoE add one shared expert whose output
is scaled by a sigmoid gate.  Expert weights are stored fused, ``gate_up_proj [E, 2I, H]`` and
``down_proj [E, H, I]`` (transformers 5.x's in-memory layout), so a GPU grouped GEMM reads them as
one tensor.

Execution groups the ``T * top_k`` token-expert assignments by expert (a stable sort), multiplies
each *active* expert's contiguous rows by its matrices (a grouped GEMM: ``F.grouped_mm`` on CPU, our
Triton kernel on CUDA, a Python loop on torch releases without it or for widths whose rows it cannot
stride) and scatter-adds the weighted results back to their tokens.  Decode therefore reads only the
weights of experts some token picked, and a batch of streams reads each picked expert once for all the
rows routed to it.  On CPU a batch of at most ``GATHER_MAX_TOKENS`` rows (decode of one to a few
streams) skips the sort and the scatter:
``moe_gather.gathered_swiglu`` runs every (token, expert) pair as a weighted sum of the expert's rows,
2-2.7x faster than the per-expert GEMVs for one token of 32 small experts (figures there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from kvreuse.runtime.models.layers import GatedMLP
from kvreuse.runtime.models.linear import Linear
from kvreuse.runtime.models.moe_config import MoEConfig
from kvreuse.runtime.models.moe_gather import Glu, gathered_swiglu, swiglu

# CPU, at most this many rows: gathered_swiglu (faster for few tokens, figures in moe_gather.py);
# more rows (8-stream decode, prefill): grouped GEMMs, one matmul per active expert
GATHER_MAX_TOKENS = 4


class Grouping(NamedTuple):
    """Token-expert assignments sorted by expert: grouped row ``i`` is token ``token[i]`` for expert ``expert[i]``."""

    token: torch.Tensor  # [T*K] int64, source row of each grouped row
    weight: torch.Tensor  # [T*K] routing weight of each grouped row
    expert: torch.Tensor  # [T*K] int64, non-decreasing


def route(logits: torch.Tensor, top_k: int, normalise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax (fp32) over experts, top-k, optionally renormalised: ``(weights [T,K], experts [T,K])``.

    Picks what transformers' Qwen3-MoE router picks.  Renormalised, the weights are the softmax over
    the top-k logits (the full softmax's denominator cancels; softmax is monotonic, so top-k of the
    logits is top-k of the probabilities): two ops instead of four, 27 vs 37 us a layer for one token
    (32 experts), weights equal to the renormalised ones within fp32 rounding.
    """
    if normalise:
        top_l, top_i = torch.topk(logits, top_k, dim=-1)
        return torch.softmax(top_l, dim=-1, dtype=torch.float32).to(logits.dtype), top_i
    top_w, top_i = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float32), top_k, dim=-1)
    return top_w.to(logits.dtype), top_i


def group_by_expert(top_i: torch.Tensor, top_w: torch.Tensor) -> Grouping:
    """Sort the ``T * K`` assignments by expert (stable: within an expert, rows keep token order)."""
    expert, order = top_i.reshape(-1).sort(stable=True)
    return Grouping(order // top_i.shape[1], top_w.reshape(-1)[order], expert)


def expert_counts(expert: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Grouped rows per expert ``[E]``, by scatter-add: no step waits on the device."""
    counts = torch.zeros(num_experts, dtype=torch.int64, device=expert.device)
    return counts.scatter_add_(0, expert, torch.ones_like(expert))


class Experts(nn.Module):
    """The routed experts of one layer, fused ``[E, 2I, H]`` and ``[E, H, I]``.

    On CPU, :meth:`pack_for_cpu` keeps those shapes but lays each expert's matrix out transposed
    (``[E, H, 2I]`` / ``[E, I, H]`` contiguous), so every expert GEMM multiplies by a row-major
    ``[in, out]`` matrix.  Measured on the 2-core AVX2 host (fp32, 1 thread, weights out of cache), one
    expert's GEMV for 1 / 2 rows, row-major ``[out, in]`` (``F.linear``) -> transposed: ``[1024, 512]``
    259 -> 157 / 333 -> 168 us, ``[2048, 512]`` 436 -> 306 / 1017 -> 470, ``[512, 128]`` 56 -> 37;
    only ``[256, 512]`` at 1 row loses (64 -> 91).  The whole expert step of a decode batch
    (``benchmarks/kernels/moe_decode.py`` shapes, 8 tokens): 3.77 -> 3.62 ms (32 experts of width 128),
    10.3 -> 9.0 ms (16 of width 512).  oneDNN's packed layout (what ``Linear`` uses) measured between
    the two and cannot feed one grouped GEMM, so it is not used here.  The same layout makes each
    expert a table of contiguous ``[in]`` rows of length ``out`` for ``gathered_swiglu``.
    """

    def __init__(
        self, num_experts: int, hidden: int, inter: int, glu: Glu = swiglu, bias: bool = False
    ) -> None:
        super().__init__()
        self.num_experts, self.hidden, self.inter = num_experts, hidden, inter
        self.glu: Callable[[torch.Tensor], torch.Tensor] = glu  # [rows, 2I] gate | up -> [rows, I]
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, inter))
        # gpt-oss's experts have biases, Qwen's none
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * inter)) if bias else None
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden)) if bias else None

    def pack_for_cpu(self) -> bool:
        """Re-lay both tensors out transposed per expert (same shapes and values, one copy); CPU only."""
        if self.gate_up_proj.device.type != "cpu":
            return False
        for name in ("gate_up_proj", "down_proj"):
            w = getattr(self, name).detach()
            setattr(
                self, name, nn.Parameter(w.transpose(1, 2).contiguous().transpose(1, 2), requires_grad=False)
            )
        return True

    def forward(self, x: torch.Tensor, top_i: torch.Tensor, top_w: torch.Tensor) -> torch.Tensor:
        """``x [T, H]`` -> ``[T, H]``: each token's routing-weighted sum over its ``top_i`` experts."""
        if x.shape[0] <= GATHER_MAX_TOKENS and self.gathers_rows():
            w = (self.gate_up_proj.transpose(1, 2), self.down_proj.transpose(1, 2))
            return gathered_swiglu(x, top_i, top_w, *w, self.glu, self.gate_up_proj_bias, self.down_proj_bias)
        g = group_by_expert(top_i, top_w)
        xs = x.index_select(0, g.token)
        plain = self.glu is swiglu and self.gate_up_proj_bias is None
        if x.is_cuda and plain:
            from kvreuse.kernels.triton_moe import grouped_swiglu  # Triton only where it can compile

            counts = expert_counts(g.expert, self.num_experts)
            ys = grouped_swiglu(xs, self.gate_up_proj, self.down_proj, counts)
        elif hasattr(F, "grouped_mm") and self._strides_fit(x):
            # torch's grouped GEMM: on CPU one loop in C++ over the active experts, no per-expert dispatch
            offs = torch.cumsum(expert_counts(g.expert, self.num_experts), 0).to(torch.int32)
            gu = self._bias(F.grouped_mm(xs, self.gate_up_proj.transpose(1, 2), offs=offs), g.expert, 0)
            ys = self._bias(
                F.grouped_mm(self.glu(gu), self.down_proj.transpose(1, 2), offs=offs), g.expert, 1
            )
        else:
            ids, counts = torch.unique_consecutive(g.expert, return_counts=True)
            ys = self._swiglu_rows(list(xs.split(counts.tolist())), ids.tolist(), g.expert)
        return torch.zeros_like(x).index_add_(0, g.token, ys * g.weight.unsqueeze(1))

    def _strides_fit(self, x: torch.Tensor) -> bool:
        """Whether ``F.grouped_mm`` takes these rows: it raises unless every row stride is a multiple of
        16 bytes, which odd widths in bf16 (hidden 44: 88 bytes) are not; those take the loop."""
        return all(n * x.element_size() % 16 == 0 for n in (self.hidden, self.inter))

    def gathers_rows(self) -> bool:
        """Whether :func:`gathered_swiglu` can read the experts: on CPU, after :meth:`pack_for_cpu`."""
        return self.gate_up_proj.device.type == "cpu" and self.gate_up_proj.transpose(1, 2).is_contiguous()

    def _bias(self, y: torch.Tensor, expert: torch.Tensor, which: int) -> torch.Tensor:
        """Add each grouped row's expert bias of the gate/up (0) or down (1) projection, where there is one."""
        b = (self.gate_up_proj_bias, self.down_proj_bias)[which]
        return y if b is None else y + b.index_select(0, expert)

    def _swiglu_rows(
        self, groups: list[torch.Tensor], experts: list[int], expert: torch.Tensor
    ) -> torch.Tensor:
        """Each group of rows through its expert's SwiGLU, results stacked in group order.

        One matmul per active expert and projection; the activation runs once over all rows.
        """
        mats = [self.expert(e, xg.dtype) for xg, e in zip(groups, experts)]
        gu = torch.cat([F.linear(xg, w[0]) for xg, w in zip(groups, mats)])
        hs = self.glu(self._bias(gu, expert, 0)).split([xg.shape[0] for xg in groups])
        return self._bias(torch.cat([F.linear(hg, w[1]) for hg, w in zip(hs, mats)]), expert, 1)

    def expert(self, e: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert ``e``'s ``gate_up [2I, H]`` and ``down [H, I]`` (a quantized subclass decodes them)."""
        return self.gate_up_proj[e], self.down_proj[e]


class SparseMoE(nn.Module):
    """Router + routed experts (+ an optional shared expert behind a sigmoid gate).

    Parameter names follow the HF checkpoints (``mlp.gate``, ``mlp.experts``, ``mlp.shared_expert``,
    ``mlp.shared_expert_gate``), so most weights load by name.
    """

    def __init__(self, hidden: int, moe: MoEConfig) -> None:
        super().__init__()
        self.top_k, self.normalise = moe.top_k, moe.norm_topk_prob
        self.gate = Linear(hidden, moe.num_experts, bias=False)
        self.experts = Experts(moe.num_experts, hidden, moe.expert_intermediate_size)
        self.shared_expert: GatedMLP | None = None
        self.shared_expert_gate: Linear | None = None
        if moe.shared_expert_intermediate_size:
            self.shared_expert = GatedMLP(hidden, moe.shared_expert_intermediate_size)
            self.shared_expert_gate = Linear(hidden, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top_w, top_i = route(self.gate.run(x), self.top_k, self.normalise)
        out = self.experts.forward(x, top_i, top_w)
        if self.shared_expert is not None:
            shared = self.shared_expert.forward(x)
            out = out + torch.sigmoid(self.shared_expert_gate.run(x)) * shared
        return out


def feed_forward(hidden: int, intermediate: int, moe: MoEConfig | None, layer: int) -> nn.Module:
    """Layer ``layer``'s feed-forward: the MoE block where the config makes it sparse, else dense SwiGLU."""
    if moe is not None and moe.is_sparse(layer):
        return SparseMoE(hidden, moe)
    return GatedMLP(hidden, intermediate)
