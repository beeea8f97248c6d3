"""Tiny random Qwen3.5 text models (transformers' Qwen3_5ForCausalLM) saved like real checkpoints."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import make_tiny_model

# name -> overrides: odd head counts, key/value head ratios 1-3, linear:full 3:1, 1:1 (odd layer count)
# and 1:0 tail, partial rotary 1/4 and 1/2, conv kernels 4 and 3, tied and untied
SHAPES = {
    "gqa-3to1-untied": dict(
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
    ),
    "odd-heads-1to1-tied": dict(
        tie=True,
        layer_types=["linear_attention", "full_attention"] * 2 + ["linear_attention"],
        num_hidden_layers=5,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=12,
        linear_num_key_heads=3,
        linear_num_value_heads=3,
        linear_key_head_dim=12,
        linear_value_head_dim=10,
    ),
    "rep3-halfrope-k3": dict(
        num_hidden_layers=3,
        num_attention_heads=5,
        num_key_value_heads=5,
        head_dim=8,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        linear_num_key_heads=1,
        linear_num_value_heads=3,
        linear_key_head_dim=16,
        linear_value_head_dim=6,
        linear_conv_kernel_dim=3,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    ),
}


def make_tiny_hybrid(out: Path, shape: str, seed: int = 0) -> Path:
    kw = dict(SHAPES[shape])
    tie = kw.pop("tie", False)
    # larger init than HF's 0.02 so logits are O(1) and a 1e-4 tolerance means something
    return make_tiny_model(out, "qwen3_5_text", tie, seed=seed, initializer_range=0.1, **kw)
