"""Parameter counts of a loaded model: in total, and read per token (what sparse experts save)."""

from __future__ import annotations

from typing import NamedTuple

from torch import nn

from kvreuse.runtime.models.linear import Linear
from kvreuse.runtime.models.moe import Experts, SparseMoE


class ParamCounts(NamedTuple):
    """Parameters in the model and those one token's forward reads (routed experts: top-k of E)."""

    total: int
    active: int
    dtype_bytes: int
    moe_layers: int
    expert_shapes: tuple[tuple[int, ...], tuple[int, ...]] | None  # fused gate_up, down of one layer

    @property
    def total_bytes(self) -> int:
        return self.total * self.dtype_bytes

    @property
    def active_bytes(self) -> int:
        return self.active * self.dtype_bytes

    def describe(self) -> str:
        """The load-time log line."""
        line = (
            f"parameters {_si(self.total)} total, {_si(self.active)} active per token; "
            f"weights {_mib(self.total_bytes)}, {_mib(self.active_bytes)} read per token"
        )
        if self.expert_shapes:
            gu, down = self.expert_shapes
            line += f"; {self.moe_layers} MoE layers, experts gate_up {list(gu)} down {list(down)}"
        return line


def count_parameters(model: nn.Module) -> ParamCounts:
    """Counted from module shapes, so it holds after :meth:`CausalLM.prepare` repacked the weights.

    A tied LM head shares the embedding table and counts once; a token reads one embedding row but
    the convention (and the "A3B" in a model's name) counts the whole table as active.
    """
    total = active = moe_layers = 0
    shapes = None
    head = getattr(model, "lm_head", None)
    tied = head is not None and bool(getattr(getattr(model, "cfg", None), "tie_word_embeddings", False))
    dtype_bytes = next(p for p in model.parameters() if p is not None).element_size()
    for m in model.modules():
        if isinstance(m, SparseMoE):
            e = m.experts
            per_expert = 3 * e.hidden * e.inter
            total += e.num_experts * per_expert
            active += m.top_k * per_expert
            moe_layers += 1
            shapes = ((e.num_experts, 2 * e.inter, e.hidden), (e.num_experts, e.hidden, e.inter))
        if isinstance(m, Experts):
            continue  # counted with its block above
        if isinstance(m, Linear):
            if m is head and tied:
                continue
            n = m.in_features * m.out_features + (m.out_features if m.bias is not None else 0)
        else:
            n = sum(p.numel() for p in m.parameters(recurse=False) if p is not None)
        total += n
        active += n
    return ParamCounts(total, active, dtype_bytes, moe_layers, shapes)


def _si(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def _mib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"
