"""The architecture facts our model code needs, read from an HF ``config.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from kvreuse.runtime.models.gemma4_config import GEMMA4, Gemma4Config, gemma4_fields
from kvreuse.runtime.models.gpt_oss_config import GPT_OSS, GptOssConfig, gpt_oss_fields
from kvreuse.runtime.models.hybrid_config import HYBRID, LinearAttnConfig, hybrid_fields, text_config
from kvreuse.runtime.models.moe_config import MoEConfig
from kvreuse.runtime.models.window_config import GEMMA, WINDOWED, GemmaConfig, gemma_fields, layer_windows

SUPPORTED = {
    "llama": "Llama 2/3, SmolLM2",
    "mistral": "Mistral",
    "qwen2": "Qwen2 / Qwen2.5",
    "qwen3": "Qwen3",
    "qwen3_moe": "Qwen3-MoE (30B-A3B, Coder-30B-A3B)",
    **WINDOWED,
    **GEMMA,
    **GEMMA4,
    **HYBRID,
    **GPT_OSS,
}


class ModelConfig(NamedTuple):
    """Decoder-only transformer shape; one class covers Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Gemma 3,
    gpt-oss and the hybrids.

    Hybrids (Qwen3.5, Qwen3-Next) also set ``layer_types`` (which layers are Gated DeltaNet linear
    attention), ``linear_attn`` (their shape) and ``partial_rotary_factor``.  ``windows``: each layer's
    sliding window (None: full attention; empty: no layer has one).  ``gemma``: Gemma 3's switches (Gemma 4
    shares them); ``gemma4``: what Gemma 4 adds (its full layers' KV shape, KV shared across layers).
    ``gpt_oss``: gpt-oss's expert activation (its sinks and biases follow from the family).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2
    qk_norm: bool  # Qwen3
    sliding_window: int | None
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    moe: MoEConfig | None = None  # routed experts (Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE); None: all dense
    layer_types: tuple[str, ...] = ()
    linear_attn: LinearAttnConfig | None = None
    partial_rotary_factor: float = 1.0
    windows: tuple[int | None, ...] = ()
    gemma: GemmaConfig | None = None
    gpt_oss: GptOssConfig | None = None
    gemma4: Gemma4Config | None = None

    @classmethod
    def from_dict(cls, c: dict[str, Any]) -> ModelConfig:
        c = text_config(c)
        mt = c.get("model_type", "")
        if mt not in SUPPORTED:
            names = ", ".join(SUPPORTED)
            raise ValueError(f"unsupported model_type {mt!r} (kvreuse runs: {names})")
        heads = c["num_attention_heads"]
        rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
        theta = c.get("rope_theta") or rope.get("rope_theta") or 10000.0
        scaling = None
        rope_type = rope.get("rope_type") or rope.get("type") or "default"
        if rope_type != "default":
            scaling = dict(rope, rope_type=rope_type)
        eos = c.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        extra = hybrid_fields(c) if mt in HYBRID else {}
        if mt in GEMMA:
            extra = gemma_fields(c)
            scaling, theta = extra.pop("rope_scaling"), extra.pop("rope_theta")
        if mt in GPT_OSS:
            extra = gpt_oss_fields(c)
        windows = layer_windows(c, mt, c["num_hidden_layers"])
        if mt in GEMMA4:
            extra = gemma4_fields(c)
            scaling, theta = extra.pop("rope_scaling"), extra.pop("rope_theta")
            windows = extra.pop("windows")
        # Gemma 4 names its experts its own way (enable_moe_block, top_k_experts): gemma4_fields reads them
        moe = extra.pop("moe") if "moe" in extra else MoEConfig.from_dict(c)
        return cls(
            model_type=mt,
            vocab_size=c["vocab_size"],
            hidden_size=c["hidden_size"],
            intermediate_size=_dense_width(c),
            num_layers=c["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=c.get("num_key_value_heads") or heads,
            head_dim=c.get("head_dim") or c["hidden_size"] // heads,
            rms_norm_eps=c.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=c.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            qkv_bias=mt == "qwen2" or bool(c.get("attention_bias", False)),
            qk_norm=mt in ("qwen3", "qwen3_moe") or mt in HYBRID or mt in GEMMA or mt in GEMMA4,
            sliding_window=max((w for w in windows if w is not None), default=None),
            eos_token_ids=eos_ids,
            bos_token_id=c.get("bos_token_id"),
            moe=moe,
            windows=windows,
            **extra,
        )

    @classmethod
    def from_dir(cls, model_dir: Path) -> ModelConfig:
        return cls.from_dict(json.loads((Path(model_dir) / "config.json").read_text()))

    @property
    def is_hybrid(self) -> bool:
        return self.linear_attn is not None

    def window(self, layer: int) -> int | None:
        """Layer ``layer``'s sliding window (None: it attends to every earlier token)."""
        return self.windows[layer] if self.windows else None

    @property
    def num_attention_layers(self) -> int:
        """Layers with a KV cache: all of them, or a hybrid's full-attention ones, or those Gemma 4
        layers that do not read another layer's KV."""
        if not self.layer_types:
            return len(self.cache_layers)
        return sum(t != "linear_attention" for t in self.layer_types)

    @property
    def kv_source(self) -> tuple[int, ...]:
        """Each layer's KV owner: itself, or (Gemma 4's KV-shared tail) an earlier layer's cache it reads."""
        if self.gemma4 is not None:
            return self.gemma4.kv_source
        return tuple(range(self.num_layers))

    @property
    def cache_layers(self) -> tuple[int, ...]:
        """The layers that own a KV cache (every layer but Gemma 4's KV-shared tail)."""
        return tuple(i for i, src in enumerate(self.kv_source) if src == i)

    def kv_shape(self, window: bool) -> tuple[int, int]:
        """(kv_heads, head_dim) of a window layer's KV or a full layer's (Gemma 4's full layers differ)."""
        if self.gemma4 is not None and not window:
            return self.gemma4.full_kv_heads, self.gemma4.full_head_dim
        return self.num_kv_heads, self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        if not self.windows:
            return 2 * self.num_attention_layers * self.num_kv_heads * self.head_dim * dtype_bytes
        shapes = [self.kv_shape(self.windows[i] is not None) for i in self.cache_layers]
        return 2 * sum(h * d for h, d in shapes) * dtype_bytes


def _dense_width(c: dict[str, Any]) -> int:
    """The dense MLP's width; Qwen3.5-MoE has no dense layer and may leave it out of its config."""
    width = c.get("intermediate_size")
    if width is None and c.get("num_experts"):
        width = c.get("shared_expert_intermediate_size") or c["moe_intermediate_size"]
    if width is None:
        raise ValueError("config.json has no intermediate_size")
    return int(width)
