"""A decoder layer's decode step through the fused CPU kernels (``kernels/native_cpu.py``).

Same arithmetic as ``DecoderLayer.forward`` (the kernels round where torch's ops round), in ten
calls instead of ~45: on a 135M model one decode step is 30 layers of four small matmuls, and the
torch ops between them cost more than the matmuls (``kernels/cpu/decode_ops.c``)::

    x = norm(h)                                 rms_norm
    qkv = x Wqkv                                matmul
    q, k = rope(norm_qk(q, k)); pool[slot] = k, v   rope_store (in place on qkv, then the pool)
    o = attention(q, pages)                     decode_attention (keys read from their pages)
    h += o Wo;  x = norm(h)                     matmul, rms_norm with the residual
    h += down(silu(gate) * up)                  matmul, silu_mul, matmul, add_

The residual stream ``h`` is updated in place: each step's ``h`` is a fresh embedding lookup.
Extend (prefill) steps take the same path with the backend's extend attention: there the torch ops
between the GEMMs are memory passes over every new row (bf16 round trips through fp32), not dispatch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kvreuse.kernels.native_cpu import NativeOps
from kvreuse.runtime.models.layers import GatedMLP


def fusable(
    ops: NativeOps | None, h: torch.Tensor, layer: torch.nn.Module, k_cache: torch.Tensor, cos: torch.Tensor
) -> bool:
    """Whether a decode step can take the fused path (checked once a step, on the first layer)."""
    attn = layer.self_attn
    return (
        ops is not None
        and ops.supports(h)
        and cos.dtype == torch.float32  # the kernels read the rope tables as fp32 rows of head_dim / 2
        and cos.shape[-1] * 2 == attn.hd
        and k_cache.dtype == h.dtype
        and layer.input_layernorm.weight.dtype == h.dtype
        and attn.hd <= 256
        and attn.nh // attn.nkv <= 16
    )


class LayerPlan(NamedTuple):
    """What a layer's fused decode step reads, looked up once per model: each ``nn.Module``
    attribute access costs ~1 us, and a step made ~12 of them a layer (~0.4 ms a token)."""

    in_w: torch.Tensor
    in_eps: float
    qkv: torch.nn.Module
    nh: int
    nkv: int
    hd: int
    q_size: int
    qn: torch.Tensor | None
    kn: torch.Tensor | None
    qk_eps: float
    scale: float
    window: int | None
    o: torch.nn.Module
    post_w: torch.Tensor
    post_eps: float
    gate_up: torch.nn.Module | None  # None: a sparse MoE block, run through its own forward
    down: torch.nn.Module | None
    mlp: torch.nn.Module


def layer_plan(layer: torch.nn.Module) -> LayerPlan:
    attn, norm, post, mlp = layer.self_attn, layer.input_layernorm, layer.post_attention_layernorm, layer.mlp
    gated = isinstance(mlp, GatedMLP)
    return LayerPlan(
        norm.weight, norm.eps, attn.qkv_proj, attn.nh, attn.nkv, attn.hd, attn.q_size,
        None if attn.q_norm is None else attn.q_norm.weight,
        None if attn.k_norm is None else attn.k_norm.weight,
        norm.eps if attn.q_norm is None else attn.q_norm.eps, attn.scale, attn.window, attn.o_proj,
        post.weight, post.eps, mlp.gate_up_proj if gated else None, mlp.down_proj if gated else None, mlp,
    )  # fmt: skip


def fused_decode_layer(
    p: LayerPlan, h: torch.Tensor, ctx, kv: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """``DecoderLayer.forward`` for one decode or extend step (``ctx`` a ``StepContext``), ``h`` updated
    in place."""
    ops: NativeOps = ctx.backend.fused
    fb = ctx.fb
    k_cache, v_cache = kv
    x = ops.rms_norm(h, p.in_w, p.in_eps)
    qkv = p.qkv.run(x).contiguous()
    ops.rope_store(qkv, p.nh, p.nkv, p.hd, ctx.cos, ctx.sin, p.qn, p.kn, p.qk_eps, k_cache, v_cache,
                   fb.slot_mapping)  # fmt: skip
    q = qkv[:, : p.q_size].view(-1, p.nh, p.hd)
    if fb.is_decode:
        o = ops.decode_attention(q, k_cache, v_cache, fb.page_table, fb.seq_lens_k, p.scale, p.window)
    else:
        o = ops.extend_attention(q, k_cache, v_cache, fb.page_table, fb.cu_seqlens_q, fb.seq_lens_k, p.scale,
                                 window=p.window)  # fmt: skip
    a = p.o.run(o.view(-1, p.q_size))
    x = ops.rms_norm(h, p.post_w, p.post_eps, residual=a.contiguous())
    if p.gate_up is not None:
        m = p.down.run(ops.silu_mul(p.gate_up.run(x).contiguous()))
    else:  # sparse MoE blocks keep their own routing
        m = p.mlp.forward(x)
    return h.add_(m)
