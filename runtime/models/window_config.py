"""Config facts of sliding-window models: which layers attend through a window (and how wide), and the
Gemma 3 family's own switches (norms, scales, local/global rope, softcapping)."""

from __future__ import annotations

from typing import Any, NamedTuple

GEMMA = {
    "gemma3_text": "Gemma 3 (text)",
    "gemma3": "Gemma 3 (text model of the multimodal checkpoint)",
}
WINDOWED = {"ministral": "Ministral (interleaved sliding-window layers)"}


class GemmaConfig(NamedTuple):
    """What a Gemma 3 decoder adds to the Llama shape: the attention scale ``query_pre_attn_scalar**-0.5``,
    the sliding layers' own rope, tanh softcapping of the final logits, the MLP's activation."""

    query_pre_attn_scalar: float
    local_rope_theta: float
    local_rope_scaling: dict[str, Any] | None
    final_logit_softcapping: float | None
    activation: str


def layer_windows(c: dict[str, Any], model_type: str, num_layers: int) -> tuple[int | None, ...]:
    """Each layer's sliding window (None: full attention); ``()`` when no layer has one.

    transformers' rule per family: ``layer_types`` where the config has them (Gemma 3, Ministral,
    Qwen2 with ``use_sliding_window``), else Mistral's ``sliding_window`` on every layer.
    """
    window = c.get("sliding_window")
    if model_type == "qwen2" and not c.get("use_sliding_window", False):
        return ()
    if not window:
        return ()
    types = c.get("layer_types")
    if types is None and model_type == "qwen2":
        first = c.get("max_window_layers", num_layers)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    if types is None and model_type == "gpt_oss":  # transformers' default: even layers slide
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]
    if types is None and model_type in GEMMA:
        every = c.get("sliding_window_pattern", c.get("_sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(num_layers)]
    if types is None:  # Mistral: one window on every layer
        types = ["sliding_attention"] * num_layers
    if len(types) != num_layers:
        raise ValueError(f"layer_types has {len(types)} entries for {num_layers} layers")
    out = tuple(int(window) if t == "sliding_attention" else None for t in types)
    return out if any(w is not None for w in out) else ()


def gemma_fields(c: dict[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields of a Gemma 3 text config, old (``rope_local_base_freq``) or new
    (``rope_parameters`` per layer type) layout."""
    if c.get("use_bidirectional_attention"):
        raise ValueError("Gemma 3 with use_bidirectional_attention is an encoder, not a causal LM")
    if c.get("attn_logit_softcapping") is not None:
        raise ValueError("attention logit softcapping (Gemma 2) is not supported")
    params = c.get("rope_parameters") or {}
    full = dict(params.get("full_attention") or {})
    local = dict(params.get("sliding_attention") or {})
    if not full:  # the layout of the published checkpoints
        full = dict(c.get("rope_scaling") or {})
        full.setdefault("rope_theta", c.get("rope_theta", 1_000_000.0))
    local.setdefault("rope_theta", c.get("rope_local_base_freq", 10_000.0))
    return {
        "rope_theta": float(full["rope_theta"]),
        "rope_scaling": _scaling(full),
        "gemma": GemmaConfig(
            query_pre_attn_scalar=float(c.get("query_pre_attn_scalar", 256)),
            local_rope_theta=float(local["rope_theta"]),
            local_rope_scaling=_scaling(local),
            final_logit_softcapping=c.get("final_logit_softcapping"),
            activation=c.get("hidden_activation") or c.get("hidden_act") or "gelu_pytorch_tanh",
        ),
    }


def _scaling(rope: dict[str, Any]) -> dict[str, Any] | None:
    kind = rope.get("rope_type") or rope.get("type") or "default"
    return None if kind == "default" else dict(rope, rope_type=kind)
