"""Qwen3.5 / Qwen3-Next / Qwen3.5-MoE: Gated DeltaNet layers interleaved with gated full attention.

Differences from ``decoder.py``'s families: ``layer_types`` picks each layer's token mixer; the
full-attention layers gate their output (``q_proj`` emits a sigmoid gate beside each query head),
rotate only ``partial_rotary_factor`` of each head, and every RMSNorm but the gated one scales by
``1 + weight``.  Only the full-attention layers own KV pages; the linear layers keep a recurrent
state per request (``runtime/runner/state_pool.py``).  The MoE variants swap the MLP for
``runtime/models/moe.py``'s sparse block with a gated shared expert, where the config says so.
"""

from __future__ import annotations

import torch
from torch import nn

from kvreuse.kernels.backends import AttentionBackend
from kvreuse.runtime.models.batch import ForwardBatch
from kvreuse.runtime.models.config import ModelConfig
from kvreuse.runtime.models.decoder import CausalLM, StepContext, decode_plans, embedding, paged_attention
from kvreuse.runtime.models.gated_deltanet import GatedDeltaNet, StateBatch
from kvreuse.runtime.models.layers import OffsetRMSNorm, RotaryEmbedding, apply_rope
from kvreuse.runtime.models.linear import Linear
from kvreuse.runtime.models.moe import feed_forward


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``2 * cos.shape[-1]`` dims of each head; the rest pass through."""
    rot = 2 * cos.shape[-1]
    if rot == x.shape[-1]:
        return apply_rope(x, cos, sin)
    return torch.cat([apply_rope(x[..., :rot], cos, sin), x[..., rot:]], dim=-1)


class GatedAttention(nn.Module):
    """Full attention over the paged pool with per-head q/k norm, partial rope and a sigmoid output gate."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = self.nh * self.hd, self.nkv * self.hd
        # rows: [query|gate interleaved per head (HF's q_proj) | k | v]
        self.qkv_proj = Linear(cfg.hidden_size, 2 * self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=cfg.qkv_bias)
        self.q_norm = OffsetRMSNorm(self.hd, cfg.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(self.hd, cfg.rms_norm_eps)
        self.scale = self.hd**-0.5

    def forward(
        self, x: torch.Tensor, ctx: StepContext, kv: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        qg, k, v = self.qkv_proj.run(x).split([2 * self.q_size, self.kv_size, self.kv_size], dim=-1)
        qg = qg.view(-1, self.nh, 2 * self.hd)
        q, gate = qg[..., : self.hd], qg[..., self.hd :]
        q = apply_partial_rope(self.q_norm.forward(q), ctx.cos, ctx.sin)
        k = apply_partial_rope(self.k_norm.forward(k.view(-1, self.nkv, self.hd)), ctx.cos, ctx.sin)
        o = paged_attention(q, k, v.view(-1, self.nkv, self.hd), ctx, kv, self.scale)
        o = o.reshape(-1, self.q_size) * torch.sigmoid(gate.reshape(-1, self.q_size))
        return self.o_proj.run(o)


class HybridLayer(nn.Module):
    """Pre-norm token mixer (Gated DeltaNet or gated attention) + gated MLP or sparse MoE, with residuals."""

    def __init__(self, cfg: ModelConfig, kind: str, index: int, layer: int) -> None:
        super().__init__()
        self.kind, self.index = kind, index  # index among layers of this kind: KV layer or state row
        self.input_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if kind == "linear_attention":
            assert cfg.linear_attn is not None
            self.linear_attn = GatedDeltaNet(cfg.linear_attn, cfg.hidden_size, cfg.rms_norm_eps, index)
        else:
            self.self_attn = GatedAttention(cfg)
        self.post_attention_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = feed_forward(cfg.hidden_size, cfg.intermediate_size, cfg.moe, layer)


class HybridCausalLM(nn.Module):
    """Embeddings, hybrid layers, final norm and LM head; logits only for the sampled rows."""

    prepare = CausalLM.prepare
    parameter_counts = CausalLM.parameter_counts

    def choose_decode(self, backend: AttentionBackend, k_cache: torch.Tensor, compile: bool) -> str:
        """Decode steps run the layers as prefill does (no fused or compiled path for hybrids yet)."""
        if compile:
            raise ValueError(f"--compile-decode supports the dense decoder models, not {self.cfg.model_type}")
        return "eager"

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        counts = {"linear_attention": 0, "full_attention": 0}
        layers = []
        for layer, kind in enumerate(cfg.layer_types):
            layers.append(HybridLayer(cfg, kind, counts[kind], layer))
            counts[kind] += 1
        self.layers = nn.ModuleList(layers)
        self.num_linear_layers = counts["linear_attention"]
        self.norm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = RotaryEmbedding(
            rotary_dim(cfg), cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling
        )

    @torch.inference_mode()
    def forward(
        self,
        fb: ForwardBatch,
        kv_layers: list[tuple[torch.Tensor, torch.Tensor]],
        backend: AttentionBackend,
        states: list[tuple[torch.Tensor, torch.Tensor]],
        sb: StateBatch,
    ) -> torch.Tensor:
        """Returns float32 logits ``[len(fb.logits_rows), vocab]``; updates the slots in ``states``."""
        plan = None
        if kv_layers:
            plan = decode_plans(fb, backend, kv_layers[0][0].shape[1], ())
        cos, sin = self.rope.lookup(fb.positions)
        ctx = StepContext(fb, cos, sin, backend, plan)
        h = self.embed_tokens(fb.input_ids)
        for layer in self.layers:
            x = layer.input_layernorm.forward(h)
            if layer.kind == "linear_attention":
                h = h + layer.linear_attn.forward(x, sb, states[layer.index], fb.is_decode)
            else:
                h = h + layer.self_attn.forward(x, ctx, kv_layers[layer.index])
            h = h + layer.mlp.forward(layer.post_attention_layernorm.forward(h))
        h = self.norm.forward(h[fb.logits_rows])
        return self.lm_head.run(h).float()


def rotary_dim(cfg: ModelConfig) -> int:
    return int(cfg.head_dim * cfg.partial_rotary_factor)
