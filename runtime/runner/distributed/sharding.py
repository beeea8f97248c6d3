"""Megatron-style tensor parallelism for our decoder: which slice of each weight a rank keeps.

Per layer, with ``w`` ranks and rank ``r``::

    qkv_proj  [q | k | v] x hidden   column-parallel: rank r keeps its q heads and its KV heads' rows
    o_proj    hidden x q              row-parallel: the matching q-head columns, then one all-reduce
    gate_up   [gate | up] x hidden    column-parallel: rows r*I/w.. of the gate half and of the up half
    down_proj hidden x I              row-parallel: the matching columns, then one all-reduce

KV heads are split across ranks when there are at least as many as ranks (``nkv % w == 0``);
with fewer, each rank keeps the one KV head its q heads attend to (replicated, GQA groups stay
whole).  Each rank's paged pool holds only its KV heads, with the same number of pages and the
same page ids everywhere, so the scheduler and the radix tree (rank 0 only) need no change.
Embeddings, norms and the LM head are replicated: every rank computes full logits and rank 0
samples; simpler than a vocabulary-parallel head plus a gather, at the cost of one LM head per rank.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kvreuse.runtime.models.config import ModelConfig
from kvreuse.runtime.models.linear import Linear


class TPGroup(NamedTuple):
    """This process's place in the tensor-parallel group."""

    rank: int
    world: int
    group: object  # kvreuse.runtime.runner.distributed.launch.Group: this group's collectives


def local_config(cfg: ModelConfig, world: int) -> ModelConfig:
    """The shapes one rank's modules have; raises ValueError when the model does not split ``world`` ways."""
    if getattr(cfg, "moe", None) is not None:
        raise ValueError("tensor parallelism does not shard mixture-of-experts layers yet")
    if getattr(cfg, "layer_types", ()):
        raise ValueError("tensor parallelism does not shard hybrid (linear-attention) models yet")
    if getattr(cfg, "gemma", None) is not None:
        raise ValueError("tensor parallelism does not shard Gemma 3 yet (its extra norms are unmapped)")
    if cfg.num_heads % world:
        raise ValueError(f"{cfg.num_heads} attention heads do not split over {world} tensor-parallel ranks")
    if cfg.intermediate_size % world:
        raise ValueError(
            f"MLP size {cfg.intermediate_size} does not split over {world} tensor-parallel ranks"
        )
    nkv = cfg.num_kv_heads
    if nkv >= world and nkv % world:
        raise ValueError(f"{nkv} KV heads do not split over {world} tensor-parallel ranks")
    if nkv < world and world % nkv:
        raise ValueError(f"{world} tensor-parallel ranks cannot share {nkv} KV heads evenly")
    return cfg._replace(
        num_heads=cfg.num_heads // world,
        num_kv_heads=max(1, nkv // world),
        intermediate_size=cfg.intermediate_size // world,
    )


def kv_heads(cfg: ModelConfig, rank: int, world: int) -> list[int]:
    """The KV heads rank ``rank`` keeps (one replicated head when there are fewer heads than ranks)."""
    nkv = cfg.num_kv_heads
    if nkv >= world:
        per = nkv // world
        return list(range(rank * per, (rank + 1) * per))
    return [rank * nkv // world]


class AllReduceLinear(Linear):
    """A row-parallel linear: each rank multiplies its input slice, the partial sums are all-reduced."""

    group: object = None

    def run(self, x: torch.Tensor) -> torch.Tensor:
        y = super().run(x)
        self.group.all_reduce(y)
        return y


def _rows(w: torch.Tensor, ranges: list[tuple[int, int]]) -> torch.Tensor:
    return torch.cat([w[a:b] for a, b in ranges])


@torch.no_grad()
def shard_into(full: torch.nn.Module, local: torch.nn.Module, cfg: ModelConfig, tp: TPGroup) -> None:
    """Copy this rank's slices of the full model's weights into ``local`` (built with ``local_config``)."""
    r, w = tp.rank, tp.world
    lc = local_config(cfg, w)
    hd, nh, nkv, inter = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size
    q_rows = [(r * lc.num_heads * hd, (r + 1) * lc.num_heads * hd)]
    heads = kv_heads(cfg, r, w)
    k_rows = [(nh * hd + h * hd, nh * hd + (h + 1) * hd) for h in heads]
    v_rows = [(a + nkv * hd, b + nkv * hd) for a, b in k_rows]
    li = lc.intermediate_size
    mlp_rows = [(r * li, (r + 1) * li), (inter + r * li, inter + (r + 1) * li)]
    for fl, ll in zip(full.layers, local.layers):
        fa, la = fl.self_attn, ll.self_attn
        la.qkv_proj.weight.copy_(_rows(fa.qkv_proj.weight, q_rows + k_rows + v_rows))
        if fa.qkv_proj.bias is not None:
            la.qkv_proj.bias.copy_(_rows(fa.qkv_proj.bias, q_rows + k_rows + v_rows))
        la.o_proj.weight.copy_(fa.o_proj.weight[:, q_rows[0][0] : q_rows[0][1]])
        for name in ("q_norm", "k_norm"):
            if getattr(fa, name) is not None:
                getattr(la, name).weight.copy_(getattr(fa, name).weight)
        ll.mlp.gate_up_proj.weight.copy_(_rows(fl.mlp.gate_up_proj.weight, mlp_rows))
        ll.mlp.down_proj.weight.copy_(fl.mlp.down_proj.weight[:, r * li : (r + 1) * li])
        ll.input_layernorm.weight.copy_(fl.input_layernorm.weight)
        ll.post_attention_layernorm.weight.copy_(fl.post_attention_layernorm.weight)
        for m in (la.o_proj, ll.mlp.down_proj):
            m.__class__ = AllReduceLinear
            m.group = tp.group
    local.embed_tokens.weight.copy_(full.embed_tokens.weight)
    local.norm.weight.copy_(full.norm.weight)
    if not cfg.tie_word_embeddings:
        local.lm_head.weight.copy_(full.lm_head.weight)
