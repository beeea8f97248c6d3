"""Model code: one decoder implementation for the dense families, one for Gemma 3 (and Gemma 4 on top of
it), one for gpt-oss, one for the hybrids (Qwen3.5)."""

from __future__ import annotations

import torch

from kvreuse.runtime.models.config import SUPPORTED, ModelConfig
from kvreuse.runtime.models.decoder import CausalLM
from kvreuse.runtime.models.gemma3 import GemmaCausalLM
from kvreuse.runtime.models.gemma4 import Gemma4CausalLM
from kvreuse.runtime.models.gpt_oss import GptOssCausalLM
from kvreuse.runtime.models.layers import RotaryEmbedding
from kvreuse.runtime.models.qwen3_5 import HybridCausalLM, rotary_dim


def build_model(
    cfg: ModelConfig, device: torch.device, dtype: torch.dtype = torch.float32
) -> CausalLM | HybridCausalLM:
    """Our module tree for any supported ``model_type``, uninitialised (weights are loaded next).

    Built on the meta device so no time goes into random initialisation of weights that are
    overwritten anyway; only the rotary tables are computed for real.
    """
    with torch.device("meta"):
        # allocate in the target dtype: no fp32 copy of an 8B model
        model = model_class(cfg)(cfg).to(dtype)
    model.to_empty(device=device)
    if cfg.tie_word_embeddings:  # to_empty gives each module its own tensor
        model.lm_head.weight = model.embed_tokens.weight
    with torch.device(device):
        # the full layers' table: Gemma 4's full layers have their own head size
        dim = cfg.kv_shape(window=False)[1] if cfg.gemma4 is not None else rotary_dim(cfg)
        model.rope = RotaryEmbedding(dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)
        if cfg.gemma is not None:  # the sliding layers' own rope base
            g = cfg.gemma
            model.local_rope = RotaryEmbedding(
                cfg.head_dim, cfg.max_position_embeddings, g.local_rope_theta, g.local_rope_scaling
            )
    return model


def model_class(cfg: ModelConfig) -> type[CausalLM] | type[HybridCausalLM]:
    if cfg.is_hybrid:
        return HybridCausalLM
    if cfg.gpt_oss is not None:
        return GptOssCausalLM
    if cfg.gemma4 is not None:
        return Gemma4CausalLM
    return GemmaCausalLM if cfg.gemma is not None else CausalLM


__all__ = [
    "SUPPORTED", "ModelConfig", "CausalLM", "GemmaCausalLM", "Gemma4CausalLM", "GptOssCausalLM", "HybridCausalLM",
    "build_model",
]  # fmt: skip
