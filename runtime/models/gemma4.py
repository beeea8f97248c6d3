"""Gemma 4 text decoder (dense or MoE) over the paged KV pool (``transformers`` Gemma4ForCausalLM).

Against Gemma 3 (``gemma3.py``, whose embedding scale, GeGLU, two rope tables, sandwich norms and
softcap it keeps), each as transformers computes it:

* norms scale by ``weight`` (not ``1 + weight``), in fp32 (``Fp32RMSNorm``); values are RMS-normed
  too, without a scale; attention runs at scale 1;
* full layers have their own head shape (``global_head_dim``, optionally fewer KV heads) and a
  "proportional" rope that rotates only the first quarter of the frequencies; with ``attention_k_eq_v``
  they take values from the key projection (before the key's norm and rope);
* per-layer input embeddings (PLE): a second token table plus a projection of the embedding give each
  layer a small vector that gates a residual branch after its MLP; every layer ends with a learned scalar;
* the last ``num_kv_shared_layers`` layers compute no KV: they attend over the KV of the last earlier
  layer of their type (``ModelConfig.kv_source``), which the runner hands them as their ``kv``;
* MoE Gemma 4 (``enable_moe_block``, the 26B-A4B) adds routed GeGLU experts (``moe.Experts``) beside
  every layer's dense MLP, each branch with its own norms, summed before the post-feed-forward norm.
  The router reads the attention residual itself (unscaled RMS norm, a learned scale and
  ``hidden ** -0.5``), renormalises its top-k softmax and scales each pick by its expert's learned scale.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from kvreuse.runtime.models.config import ModelConfig
from kvreuse.runtime.models.decoder import StepContext, cached_attention, embedding, paged_attention
from kvreuse.runtime.models.gemma3 import GeGLUMLP, GemmaCausalLM
from kvreuse.runtime.models.layers import Fp32RMSNorm, apply_rope
from kvreuse.runtime.models.linear import Linear
from kvreuse.runtime.models.moe import Experts, SparseMoE, route


class Gemma4Attention(nn.Module):
    """q/k/v projections kept apart (their widths differ per layer type and k may stand in for v)."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        g4 = cfg.gemma4
        assert g4 is not None
        self.window = cfg.window(layer)
        self.nkv, self.hd = cfg.kv_shape(self.window is not None)
        self.nh, eps = cfg.num_heads, cfg.rms_norm_eps
        self.q_proj = Linear(cfg.hidden_size, self.nh * self.hd, bias=False)
        self.q_norm = Fp32RMSNorm(self.hd, eps)
        self.o_proj = Linear(self.nh * self.hd, cfg.hidden_size, bias=False)
        self.shared = g4.kv_source[layer] != layer  # reads an earlier layer's KV: no k/v weights
        if not self.shared:
            self.k_proj = Linear(cfg.hidden_size, self.nkv * self.hd, bias=False)
            self.k_norm = Fp32RMSNorm(self.hd, eps)
            self.v_proj = None
            if not (g4.k_eq_v and self.window is None):
                self.v_proj = Linear(cfg.hidden_size, self.nkv * self.hd, bias=False)
        self.eps = eps

    def forward(
        self, x: torch.Tensor, ctx: StepContext, kv: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        q = apply_rope(self.q_norm.forward(self.q_proj.run(x).view(-1, self.nh, self.hd)), ctx.cos, ctx.sin)
        if self.shared:
            o = cached_attention(q, ctx, kv, 1.0, self.window)
        else:
            k_raw = self.k_proj.run(x).view(-1, self.nkv, self.hd)
            v = k_raw if self.v_proj is None else self.v_proj.run(x).view(-1, self.nkv, self.hd)
            k = apply_rope(self.k_norm.forward(k_raw), ctx.cos, ctx.sin)
            v = F.rms_norm(v.float(), (self.hd,), None, self.eps).to(v.dtype)
            o = paged_attention(q, k, v, ctx, kv, 1.0, self.window)
        return self.o_proj.run(o.reshape(-1, self.nh * self.hd))


class GeGLU(NamedTuple):
    """The experts' activation over ``[rows, 2I]`` (gate | up): ``gelu(gate) * up``, the config's gelu."""

    approximate: str  # "tanh" (gelu_pytorch_tanh) or "none"

    def __call__(self, gu: torch.Tensor) -> torch.Tensor:
        gate, up = gu.chunk(2, dim=-1)
        return F.gelu(gate, approximate=self.approximate) * up


class Gemma4Router(nn.Module):
    """transformers' ``Gemma4TextRouter``: top-k experts and their weights for each row of the residual."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, eps: float) -> None:
        super().__init__()
        self.proj = Linear(hidden, num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(hidden))
        self.per_expert_scale = nn.Parameter(torch.ones(num_experts))
        self.top_k, self.eps, self.root = top_k, eps, hidden**-0.5

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights [T, K] in h's dtype, experts [T, K])``."""
        x = F.rms_norm(h.float(), (h.shape[-1],), None, self.eps).to(h.dtype) * self.scale * self.root
        # softmax over the top-k logits == the renormalised top-k of the softmax; fp32 like the reference
        top_w, top_i = route(self.proj.run(x).float(), self.top_k, True)
        return (top_w * self.per_expert_scale.float()[top_i]).to(h.dtype), top_i


class Gemma4MoE(SparseMoE):
    """The router and the routed experts of one layer (``router.*``, ``experts.*`` in the checkpoint,
    nested here by ``gemma4_weight``); a ``SparseMoE`` for what reads its shape (parameter counts)."""

    def __init__(self, cfg: ModelConfig, activation: str) -> None:
        nn.Module.__init__(self)  # not SparseMoE's: no ``gate`` Linear, no shared expert
        moe = cfg.moe
        assert moe is not None
        self.top_k, self.normalise = moe.top_k, True
        self.shared_expert = self.shared_expert_gate = None
        self.router = Gemma4Router(cfg.hidden_size, moe.num_experts, moe.top_k, cfg.rms_norm_eps)
        glu = GeGLU(activation)
        self.experts = Experts(moe.num_experts, cfg.hidden_size, moe.expert_intermediate_size, glu)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` (the normed input) through the experts ``residual`` (the un-normed one) routes it to."""
        top_w, top_i = self.router.forward(x if residual is None else residual)
        return self.experts.forward(x, top_i, top_w)


def gemma4_weight(name: str) -> str:
    """A checkpoint name in our module tree: the layer's ``router`` and ``experts`` live in its ``moe``."""
    return re.sub(r"^(model\.layers\.\d+\.)(router|experts)\.", r"\1moe.\2.", name)


class Gemma4DecoderLayer(nn.Module):
    """Sandwich-normed attention and GeGLU MLP (and beside it the experts, MoE Gemma 4), then the
    per-layer-input branch and the layer scalar."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        g, g4 = cfg.gemma, cfg.gemma4
        assert g is not None and g4 is not None
        eps, hidden = cfg.rms_norm_eps, cfg.hidden_size
        self.local = cfg.window(layer) is not None
        self.self_attn = Gemma4Attention(cfg, layer)
        self.input_layernorm = Fp32RMSNorm(hidden, eps)
        self.post_attention_layernorm = Fp32RMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = Fp32RMSNorm(hidden, eps)
        self.post_feedforward_layernorm = Fp32RMSNorm(hidden, eps)
        wide = 2 if g4.wide_mlp and self.self_attn.shared else 1
        self.mlp = GeGLUMLP(hidden, cfg.intermediate_size * wide, g.activation)
        self.moe: Gemma4MoE | None = None
        if cfg.moe is not None:  # every layer of a MoE Gemma 4 has the experts beside its dense MLP
            self.moe = Gemma4MoE(cfg, self.mlp.approximate)
            self.post_feedforward_layernorm_1 = Fp32RMSNorm(hidden, eps)
            self.pre_feedforward_layernorm_2 = Fp32RMSNorm(hidden, eps)
            self.post_feedforward_layernorm_2 = Fp32RMSNorm(hidden, eps)
        self.ple = g4.ple_dim > 0
        if self.ple:
            self.per_layer_input_gate = Linear(hidden, g4.ple_dim, bias=False)
            self.per_layer_projection = Linear(g4.ple_dim, hidden, bias=False)
            self.post_per_layer_input_norm = Fp32RMSNorm(hidden, eps)
        self.layer_scalar = nn.Parameter(torch.ones(1))

    def forward(
        self,
        h: torch.Tensor,
        ctx: StepContext,
        kv: tuple[torch.Tensor, torch.Tensor],
        per_layer: torch.Tensor | None = None,
    ) -> torch.Tensor:
        a = self.self_attn.forward(self.input_layernorm.forward(h), ctx, kv)
        h = h + self.post_attention_layernorm.forward(a)
        m = self.mlp.forward(self.pre_feedforward_layernorm.forward(h))
        if self.moe is not None:
            e = self.moe.forward(self.pre_feedforward_layernorm_2.forward(h), h)
            m = self.post_feedforward_layernorm_1.forward(m) + self.post_feedforward_layernorm_2.forward(e)
        h = h + self.post_feedforward_layernorm.forward(m)
        if per_layer is not None:
            gate = F.gelu(self.per_layer_input_gate.run(h), approximate=self.mlp.approximate) * per_layer
            h = h + self.post_per_layer_input_norm.forward(self.per_layer_projection.run(gate))
        return h * self.layer_scalar


class Gemma4CausalLM(GemmaCausalLM):
    """Gemma 3's embedding, contexts and head around Gemma 4's layers and per-layer input embeddings."""

    layer_class = Gemma4DecoderLayer
    norm_class = Fp32RMSNorm

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        g4 = cfg.gemma4
        assert g4 is not None
        if g4.ple_dim:
            width = cfg.num_layers * g4.ple_dim
            self.embed_tokens_per_layer = embedding(g4.ple_vocab, width)
            self.per_layer_model_projection = Linear(cfg.hidden_size, width, bias=False)
            self.per_layer_projection_norm = Fp32RMSNorm(g4.ple_dim, cfg.rms_norm_eps)

    def per_layer_inputs(self, ids: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
        """``[T, layers, ple_dim]``: the token's own per-layer embedding averaged with a projection of
        its (scaled) embedding, as transformers' ``project_per_layer_inputs``; None without PLE."""
        g4 = self.cfg.gemma4
        assert g4 is not None
        if not g4.ple_dim:
            return None
        shape = (ids.shape[0], self.cfg.num_layers, g4.ple_dim)
        w = self.embed_tokens_per_layer.weight
        own = self.embed_tokens_per_layer(ids) * torch.tensor(g4.ple_dim**0.5, dtype=w.dtype)
        proj = self.per_layer_model_projection.run(h) * self.cfg.hidden_size**-0.5
        proj = self.per_layer_projection_norm.forward(proj.view(shape))
        return (proj + own.view(shape)) * 2.0**-0.5
