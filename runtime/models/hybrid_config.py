"""Config facts of the hybrid families (Qwen3.5, Qwen3-Next): which layers are linear attention, and their shape."""

from __future__ import annotations

from typing import Any, NamedTuple

HYBRID = {
    "qwen3_5_text": "Qwen3.5 (text)",
    "qwen3_5": "Qwen3.5 (text model of the multimodal checkpoint)",
    "qwen3_next": "Qwen3-Next (80B-A3B; sparse MoE layers with a shared expert)",
    "qwen3_5_moe_text": "Qwen3.5-MoE (text; every layer a sparse MoE block with a shared expert)",
    "qwen3_5_moe": "Qwen3.5-MoE (text model of the multimodal checkpoint)",
}
# multimodal checkpoints whose text model is nested under ``text_config`` (Gemma 3's too)
_NESTED = ("qwen3_5", "qwen3_5_moe", "gemma3", "gemma4")


class LinearAttnConfig(NamedTuple):
    """Shape of a Gated DeltaNet layer: value heads share key heads in groups, a short causal conv."""

    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def state_bytes(self, conv_elem: int) -> int:
        """One layer's snapshot: the fp32 recurrent state plus the conv window in the model dtype."""
        rec = self.num_v_heads * self.k_head_dim * self.v_head_dim * 4
        return rec + self.conv_dim * (self.conv_kernel - 1) * conv_elem


def text_config(c: dict[str, Any]) -> dict[str, Any]:
    """The text model's config: a multimodal ``qwen3_5(_moe)`` / ``gemma3`` checkpoint nests it under
    ``text_config``."""
    if c.get("model_type") in _NESTED and "text_config" in c:
        inner = dict(c["text_config"])
        inner["model_type"] = c["model_type"]
        inner.setdefault("tie_word_embeddings", c.get("tie_word_embeddings", False))
        for key in ("eos_token_id", "bos_token_id"):
            if inner.get(key) is None and c.get(key) is not None:
                inner[key] = c[key]
        return inner
    return c


def hybrid_fields(c: dict[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields only hybrids set: layer types, linear-attention shape, partial rotary."""
    n = c["num_hidden_layers"]
    types = c.get("layer_types")
    if types is None:
        every = c.get("full_attention_interval", 4)
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    bad = sorted(set(types) - {"linear_attention", "full_attention"})
    if bad or len(types) != n:
        raise ValueError(f"layer_types must list {n} of linear_attention/full_attention, got {types!r}")
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    return dict(
        layer_types=tuple(types),
        linear_attn=LinearAttnConfig(
            num_k_heads=c.get("linear_num_key_heads", 16),
            num_v_heads=c.get("linear_num_value_heads", 32),
            k_head_dim=c.get("linear_key_head_dim", 128),
            v_head_dim=c.get("linear_value_head_dim", 128),
            conv_kernel=c.get("linear_conv_kernel_dim", 4),
        ),
        partial_rotary_factor=float(rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 0.25))),
    )
