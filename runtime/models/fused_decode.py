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
"""

from __future__ import annotations

import torch

from kernels.native_cpu import NativeOps
from runtime.models.layers import GatedMLP


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


def fused_decode_layer(
    layer: torch.nn.Module, h: torch.Tensor, ctx, kv: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """``DecoderLayer.forward`` for one decode step (``ctx`` a ``StepContext``), ``h`` updated in place."""
    ops: NativeOps = ctx.backend.fused
    attn, fb = layer.self_attn, ctx.fb
    k_cache, v_cache = kv
    norm = layer.input_layernorm
    x = ops.rms_norm(h, norm.weight, norm.eps)
    qkv = attn.qkv_proj.run(x).contiguous()
    qn = None if attn.q_norm is None else attn.q_norm.weight
    kn = None if attn.k_norm is None else attn.k_norm.weight
    eps = norm.eps if attn.q_norm is None else attn.q_norm.eps
    ops.rope_store(qkv, attn.nh, attn.nkv, attn.hd, ctx.cos, ctx.sin, qn, kn, eps, k_cache, v_cache,
                   fb.slot_mapping)  # fmt: skip
    q = qkv[:, : attn.q_size].view(-1, attn.nh, attn.hd)
    o = ops.decode_attention(q, k_cache, v_cache, fb.page_table, fb.seq_lens_k, attn.scale)
    a = attn.o_proj.run(o.view(-1, attn.q_size))
    post = layer.post_attention_layernorm
    x = ops.rms_norm(h, post.weight, post.eps, residual=a.contiguous())
    mlp = layer.mlp
    if isinstance(mlp, GatedMLP):
        m = mlp.down_proj.run(ops.silu_mul(mlp.gate_up_proj.run(x).contiguous()))
    else:  # sparse MoE blocks keep their own routing
        m = mlp.forward(x)
    return h.add_(m)
