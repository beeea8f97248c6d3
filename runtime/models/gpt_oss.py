"""gpt-oss over the paged KV pool (``transformers.models.gpt_oss``: GptOssForCausalLM).

What it changes against the Llama decoder (``decoder.py``), each as transformers computes it:

* attention has a learned **sink** logit per query head in the softmax's denominator
  (every attention backend takes ``sinks``: ``kernels/reference.py``), and biases on q, k, v and o;
* layers alternate 128-token sliding-window and full attention (``layer_types``; the window layers'
  KV lives in the ``WindowPool`` rings like Gemma 3's), rope is YaRN (``layers.rope_inv_freq``);
* every layer's feed-forward is a MoE: a router with a bias, top-k of its logits and a softmax over
  those k (``moe.route`` renormalised), biased experts with the clamped SwiGLU
  ``(clamp(up, +-limit) + 1) * g * sigmoid(alpha * g)``, ``g = clamp(gate, max=limit)``.

Decode is eager or ``--compile-decode``: the fused CPU decode kernels are Llama's layer (no sinks).
An MXFP4 checkpoint's experts stay MXFP4 (``mxfp4.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from kvreuse.kernels.backends import AttentionBackend
from kvreuse.runtime.models.config import ModelConfig
from kvreuse.runtime.models.decoder import (
    CausalLM,
    DecoderLayer,
    PagedAttention,
    StepContext,
    paged_attention,
)
from kvreuse.runtime.models.layers import RMSNorm
from kvreuse.runtime.models.linear import Linear
from kvreuse.runtime.models.moe import Experts, SparseMoE, route
from kvreuse.runtime.models.mxfp4 import Mxfp4Experts


class ClampedSwiGLU(NamedTuple):
    """gpt-oss's expert activation over ``[rows, 2I]`` (gate | up, de-interleaved at load)."""

    alpha: float
    limit: float

    def __call__(self, gu: torch.Tensor) -> torch.Tensor:
        gate, up = gu.chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


class SinkAttention(PagedAttention):
    """``PagedAttention`` with an o bias and a sink logit per query head."""

    def __init__(self, cfg: ModelConfig, window: int | None) -> None:
        super().__init__(cfg, window)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=True)
        self.sinks = nn.Parameter(torch.empty(self.nh))

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        ctx: StepContext,
        kv: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        return paged_attention(q, k, v, ctx, kv, self.scale, self.window, self.sinks)


class GptOssMoE(SparseMoE):
    """Router (``mlp.router``, with a bias) over biased experts with the clamped SwiGLU; no shared expert.

    A ``SparseMoE`` for what reads its shape (parameter counts), with the checkpoint's names.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        nn.Module.__init__(self)  # not SparseMoE's: no ``gate`` Linear, the router has its own name
        moe, g = cfg.moe, cfg.gpt_oss
        assert moe is not None and g is not None
        self.top_k, self.normalise = moe.top_k, True
        self.shared_expert = self.shared_expert_gate = None
        self.router = Linear(cfg.hidden_size, moe.num_experts, bias=True)
        glu = ClampedSwiGLU(g.swiglu_alpha, g.swiglu_limit)
        kind = Mxfp4Experts if g.mxfp4 else Experts
        self.experts = kind(moe.num_experts, cfg.hidden_size, moe.expert_intermediate_size, glu, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top_w, top_i = route(self.router.run(x), self.top_k, True)
        return self.experts.forward(x, top_i, top_w)


class GptOssDecoderLayer(DecoderLayer):
    """Pre-norm sink attention + the MoE block, with residuals (``DecoderLayer.forward``)."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        nn.Module.__init__(self)  # DecoderLayer's modules, built as gpt-oss's
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SinkAttention(cfg, cfg.window(layer))
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GptOssMoE(cfg)


class GptOssCausalLM(CausalLM):
    """gpt-oss's embeddings, decoder layers, final norm and LM head (``CausalLM.forward``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.layers = nn.ModuleList(GptOssDecoderLayer(cfg, i) for i in range(cfg.num_layers))

    def choose_decode(self, backend: AttentionBackend, k_cache: torch.Tensor | None, compile: bool) -> str:
        """``compiled`` (``--compile-decode``) or ``eager``: the fused CPU kernels are Llama's layer."""
        if compile:
            self.compile_decode()
            return "compiled"
        return "eager"


def gpt_oss_weight(name: str, w: torch.Tensor) -> tuple[str, torch.Tensor]:
    """A checkpoint tensor in our layout: transformers keeps the experts ``[E, in, out]`` with gate and
    up interleaved in the last axis (``gate_up[..., ::2]``, ``[..., 1::2]``); ours are ``[E, out, in]``,
    gate rows then up rows.  MXFP4 blocks are ``[E, out, in/32, 16]`` with the same interleaved rows."""
    if name.endswith(("mlp.experts.gate_up_proj_blocks", "mlp.experts.gate_up_proj_scales")):
        w = w.flatten(2)  # blocks [E, 2I, H/32, 16] -> [E, 2I, H/2]; rows interleave gate and up
        return name, torch.cat((w[:, 0::2], w[:, 1::2]), dim=1)
    if name.endswith("mlp.experts.down_proj_blocks"):
        return name, w.flatten(2)
    if name.endswith("mlp.experts.gate_up_proj"):
        w = w.transpose(1, 2)
        return name, torch.cat((w[:, 0::2], w[:, 1::2]), dim=1)
    if name.endswith("mlp.experts.gate_up_proj_bias"):
        return name, torch.cat((w[:, 0::2], w[:, 1::2]), dim=1)
    if name.endswith("mlp.experts.down_proj"):
        return name, w.transpose(1, 2)
    return name, w
