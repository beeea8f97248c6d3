"""Real MoE checkpoints' shapes from their configs alone (no weights): total vs active parameters per token.

The models are built on the meta device, so nothing is allocated; the figures are what the load-time
log line (``kvreuse.runtime.models.summary``) prints for the real checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch

from kvreuse.runtime.models.config import ModelConfig

# the published config.json fields that shape the parameters (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-Next-80B-A3B-Instruct)
REAL_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen3-30B-A3B": dict(
        model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
        moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
        head_dim=128, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, tie_word_embeddings=False,
        max_position_embeddings=40960,
    ),
    "Qwen3-Next-80B-A3B": dict(
        model_type="qwen3_next", vocab_size=151936, hidden_size=2048, intermediate_size=5120,
        moe_intermediate_size=512, shared_expert_intermediate_size=512, num_hidden_layers=48,
        num_attention_heads=16, num_key_value_heads=2, head_dim=256, num_experts=512, num_experts_per_tok=10,
        norm_topk_prob=True, decoder_sparse_step=1, full_attention_interval=4, linear_num_key_heads=16,
        linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        partial_rotary_factor=0.25, tie_word_embeddings=False, max_position_embeddings=4096,
    ),
}  # fmt: skip


def shape_figures(dtype: torch.dtype = torch.bfloat16) -> dict[str, dict[str, Any]]:
    """Per real config: parameter counts, the load log line and KV bytes per token, in ``dtype``."""
    from kvreuse.runtime.models.decoder import CausalLM
    from kvreuse.runtime.models.qwen3_5 import HybridCausalLM

    out = {}
    for name, c in REAL_CONFIGS.items():
        cfg = ModelConfig.from_dict(c)
        with torch.device("meta"):
            counts = (HybridCausalLM if cfg.is_hybrid else CausalLM)(cfg).to(dtype).parameter_counts()
        out[name] = {
            "dtype": str(dtype).removeprefix("torch."),
            "total": counts.total,
            "active": counts.active,
            "moe_layers": counts.moe_layers,
            "expert_shapes": counts.expert_shapes,
            "kv_bytes_per_token": cfg.kv_bytes_per_token(counts.dtype_bytes),
            "log": counts.describe(),
        }
    return out
