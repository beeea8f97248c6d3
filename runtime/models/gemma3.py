"""Gemma 3 text decoder over the paged KV pool (``transformers.models.gemma3``: Gemma3ForCausalLM).

What it changes against the Llama decoder (``decoder.py``), each as transformers computes it:

* RMSNorms scale by ``1 + weight`` in fp32 before casting back (``OffsetRMSNorm``), also on q and k per
  head; every layer norms the attention output and the MLP's input and output too (four norms);
* the attention scale is ``query_pre_attn_scalar ** -0.5``, not ``head_dim ** -0.5``;
* layers alternate sliding-window ("sliding_attention", rope base ``local_rope_theta``) and full
  attention (rope base ``rope_theta``, optionally linear-scaled): two rope tables;
* the embedding is scaled by ``sqrt(hidden)`` (rounded to the weights' dtype), the MLP is GeGLU with
  the tanh gelu, the final logits are softcapped (``tanh(x / c) * c``) where the config says.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvreuse.kernels.backends import AttentionBackend
from kvreuse.runtime.models.batch import ForwardBatch
from kvreuse.runtime.models.config import ModelConfig
from kvreuse.runtime.models.decoder import CausalLM, PagedAttention, StepContext, step_contexts
from kvreuse.runtime.models.layers import GatedMLP, OffsetRMSNorm


class GeGLUMLP(GatedMLP):
    """``down(gelu(gate) * up)``, gate and up fused into one matmul; the tanh gelu unless the config
    asks for the exact one."""

    def __init__(self, hidden: int, inter: int, activation: str) -> None:
        super().__init__(hidden, inter)
        if activation not in ("gelu_pytorch_tanh", "gelu"):
            raise ValueError(f"unsupported Gemma activation {activation!r} (gelu_pytorch_tanh, gelu)")
        self.approximate = "tanh" if activation == "gelu_pytorch_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.run(x).chunk(2, dim=-1)
        return self.down_proj.run(F.gelu(gate, approximate=self.approximate) * up)


class GemmaDecoderLayer(nn.Module):
    """Sandwich-normed attention and GeGLU MLP; ``local`` layers use the sliding window and local rope."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        g = cfg.gemma
        assert g is not None
        eps, hidden = cfg.rms_norm_eps, cfg.hidden_size
        self.local = cfg.window(layer) is not None
        self.self_attn = PagedAttention(cfg, cfg.window(layer))
        self.self_attn.q_norm = OffsetRMSNorm(cfg.head_dim, eps)
        self.self_attn.k_norm = OffsetRMSNorm(cfg.head_dim, eps)
        self.self_attn.scale = g.query_pre_attn_scalar**-0.5
        self.input_layernorm = OffsetRMSNorm(hidden, eps)
        self.post_attention_layernorm = OffsetRMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = OffsetRMSNorm(hidden, eps)
        self.post_feedforward_layernorm = OffsetRMSNorm(hidden, eps)
        self.mlp = GeGLUMLP(hidden, cfg.intermediate_size, g.activation)

    def forward(
        self, h: torch.Tensor, ctx: StepContext, kv: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        a = self.self_attn.forward(self.input_layernorm.forward(h), ctx, kv)
        h = h + self.post_attention_layernorm.forward(a)
        m = self.mlp.forward(self.pre_feedforward_layernorm.forward(h))
        return h + self.post_feedforward_layernorm.forward(m)


class GemmaCausalLM(CausalLM):
    """Gemma 3's embeddings (scaled), decoder layers, final norm, LM head and logit softcap.

    ``local_rope`` (the sliding layers' table) is built beside ``rope`` by ``build_model``.  Gemma 4
    (``gemma4.py``) keeps the embedding, contexts and head, with its own layers and norms.
    """

    layer_class: type[nn.Module] = GemmaDecoderLayer
    norm_class: type[nn.Module] = OffsetRMSNorm

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.layers = nn.ModuleList(self.layer_class(cfg, i) for i in range(cfg.num_layers))
        self.norm = self.norm_class(cfg.hidden_size, cfg.rms_norm_eps)
        self.local_rope: nn.Module | None = None

    def choose_decode(self, backend: AttentionBackend, k_cache: torch.Tensor | None, compile: bool) -> str:
        """``compiled`` (``--compile-decode``) or ``eager``: the fused CPU kernels are Llama's layer."""
        if compile:
            self.compile_decode()
            return "compiled"
        return "eager"

    def compile_decode(self) -> None:
        """``torch.compile`` the decode step's layer (see ``CausalLM.compile_decode``)."""
        self.decode_run = (torch.compile(self.layer_class.forward, dynamic=True), list(self.layers))

    def contexts(
        self, fb: ForwardBatch, ring: ForwardBatch | None, backend: AttentionBackend, page_size: int
    ) -> tuple[StepContext, StepContext]:
        """The full layers' step context (global rope) and the sliding layers' (local rope, their rings)."""
        assert self.local_rope is not None
        full, local = step_contexts(fb, ring, *self.rope.lookup(fb.positions), backend, page_size,
                                    self.cfg.windows)  # fmt: skip
        return full, local._replace(**dict(zip(("cos", "sin"), self.local_rope.lookup(fb.positions))))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings scaled by ``sqrt(hidden)``, the scale rounded to the weights' dtype."""
        w = self.embed_tokens.weight
        return self.embed_tokens(ids) * torch.tensor(self.cfg.hidden_size**0.5, dtype=w.dtype)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm, LM head and the config's tanh softcap, in float32."""
        g = self.cfg.gemma
        assert g is not None
        logits = self.lm_head.run(self.norm.forward(h)).float()
        if g.final_logit_softcapping is not None:
            cap = g.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits

    @torch.inference_mode()
    def forward(
        self,
        fb: ForwardBatch,
        kv_layers: list[tuple[torch.Tensor, torch.Tensor]],
        backend: AttentionBackend,
        ring: ForwardBatch | None = None,
    ) -> torch.Tensor:
        """Returns float32 logits ``[len(fb.logits_rows), vocab]`` (``ring``: see ``CausalLM.forward``)."""
        full, local = self.contexts(fb, ring, backend, kv_layers[0][0].shape[1])
        h = self.embed(fb.input_ids)
        per_layer = self.per_layer_inputs(fb.input_ids, h)
        run_layer = self.layer_class.forward
        if fb.is_decode and self.decode_run is not None:
            run_layer = self.decode_run[0]
        for i, (layer, kv) in enumerate(zip(self.layers, kv_layers)):
            extra = () if per_layer is None else (per_layer[:, i],)
            h = run_layer(layer, h, local if layer.local else full, kv, *extra)
        return self.head(h[fb.logits_rows])

    def per_layer_inputs(self, ids: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
        """``[T, layers, dim]``: a per-layer input for each token (Gemma 4's PLE); None for Gemma 3."""
        return None
