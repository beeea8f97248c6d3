"""Config facts of Gemma 4 text decoders (``transformers.models.gemma4``: Gemma4ForCausalLM) beyond what
Gemma 3 already has (``window_config.GemmaConfig``): the full layers' own KV shape, keys reused as values,
per-layer input embeddings, the last layers reading an earlier layer's KV, and the MoE variant's experts."""

from __future__ import annotations

from typing import Any, NamedTuple

from kvreuse.runtime.models.moe_config import MoEConfig
from kvreuse.runtime.models.window_config import GemmaConfig, _scaling, layer_windows

GEMMA4 = {
    "gemma4_text": "Gemma 4 (text, dense and MoE)",
    "gemma4": "Gemma 4 (text model of the multimodal checkpoint)",
}


class Gemma4Config(NamedTuple):
    """What a Gemma 4 decoder adds to Gemma 3's switches.

    ``full_head_dim``/``full_kv_heads``: the full-attention layers' head shape (the sliding layers keep
    ``head_dim``/``num_kv_heads``); ``k_eq_v``: full layers take their values from the key projection;
    ``kv_source[i]``: the layer whose KV layer ``i`` attends to (itself, or for the last
    ``num_kv_shared_layers`` the last earlier layer of its type); ``ple_dim``/``ple_vocab``: per-layer
    input embeddings (0: none); ``wide_mlp``: the KV-reading layers' MLP is twice as wide.
    """

    full_head_dim: int
    full_kv_heads: int
    k_eq_v: bool
    kv_source: tuple[int, ...]
    ple_dim: int
    ple_vocab: int
    wide_mlp: bool


def gemma4_fields(c: dict[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields of a Gemma 4 text config (as ``save_pretrained`` writes it: per-layer
    overrides in ``per_layer_config``, or the published ``global_head_dim`` keys)."""
    # "vision" (the larger multimodal checkpoints) attends bidirectionally only within an image's tokens,
    # which a text-only runtime never has: causal over text, as transformers masks text-only inputs
    if c.get("use_bidirectional_attention") not in (None, "vision"):
        raise ValueError("Gemma 4 with use_bidirectional_attention='all' is not a causal text model")
    n = c["num_hidden_layers"]
    types = list(c.get("layer_types") or [])
    if not types:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    types[-1] = "full_attention"  # transformers forces it
    c = dict(c, layer_types=types)
    full_hd, full_kv = _full_shape(c, types)
    params = c.get("rope_parameters") or {}
    full = dict(params.get("full_attention") or {"rope_type": "proportional", "rope_theta": 1_000_000.0,
                                                  "partial_rotary_factor": 0.25})  # fmt: skip
    local = dict(params.get("sliding_attention") or {"rope_type": "default", "rope_theta": 10_000.0})
    full.setdefault("rope_theta", 1_000_000.0)
    local.setdefault("rope_theta", 10_000.0)
    return {
        "rope_theta": float(full["rope_theta"]),
        "rope_scaling": _scaling(full),
        "windows": layer_windows(c, "gemma4_text", n),
        "gemma": GemmaConfig(
            query_pre_attn_scalar=1.0,  # Gemma 4 attends with scale 1 (q and k are RMS-normed)
            local_rope_theta=float(local["rope_theta"]),
            local_rope_scaling=_scaling(local),
            final_logit_softcapping=c.get("final_logit_softcapping"),
            activation=c.get("hidden_activation") or "gelu_pytorch_tanh",
        ),
        "gemma4": Gemma4Config(
            full_head_dim=full_hd,
            full_kv_heads=full_kv,
            k_eq_v=bool(c.get("attention_k_eq_v", False)),
            kv_source=kv_sources(types, int(c.get("num_kv_shared_layers") or 0)),
            ple_dim=int(c.get("hidden_size_per_layer_input") or 0),
            ple_vocab=int(c.get("vocab_size_per_layer_input") or c["vocab_size"]),
            wide_mlp=bool(c.get("use_double_wide_mlp", False)),
        ),
        "moe": gemma4_moe(c),
    }


def gemma4_moe(c: dict[str, Any]) -> MoEConfig | None:
    """The experts beside every layer's dense MLP where ``enable_moe_block`` (None without it, whatever
    ``num_experts`` says: transformers builds no experts then).  Every layer has them, and the router
    always renormalises its top-k (then scales each pick by its expert's learned scale)."""
    if not c.get("enable_moe_block"):
        return None
    experts, top_k, width = (c.get(k) for k in ("num_experts", "top_k_experts", "moe_intermediate_size"))
    if not (isinstance(experts, int) and experts > 0 and isinstance(width, int) and width > 0):
        raise ValueError(
            f"Gemma 4 with enable_moe_block needs num_experts and moe_intermediate_size >= 1 "
            f"(got {experts}, {width})"
        )
    if not (isinstance(top_k, int) and 1 <= top_k <= experts):
        raise ValueError(f"Gemma 4 top_k_experts={top_k} must be between 1 and num_experts={experts}")
    return MoEConfig(
        num_experts=experts,
        top_k=top_k,
        expert_intermediate_size=width,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=(),
        shared_expert_intermediate_size=0,  # the dense MLP runs beside the experts, ungated
    )


def _full_shape(c: dict[str, Any], types: list[str]) -> tuple[int, int]:
    """The full layers' (head_dim, kv_heads); one shape for all of them, the sliding layers' untouched."""
    hd, nkv = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"], c.get("num_key_value_heads")
    nkv = nkv or c["num_attention_heads"]
    per_layer = {int(k): v for k, v in (c.get("per_layer_config") or {}).items()}
    if not per_layer:
        k_eq_v = c.get("attention_k_eq_v", False)
        full_kv = (c.get("num_global_key_value_heads") if k_eq_v else None) or nkv
        return int(c.get("global_head_dim") or 512), int(full_kv)
    shapes = set()
    for i, t in enumerate(types):
        o = per_layer.get(i, {})
        if t == "sliding_attention" and o:
            raise ValueError(f"per_layer_config overrides sliding layer {i}: not supported")
        if t == "full_attention":
            shapes.add((int(o.get("head_dim", hd)), int(o.get("num_key_value_heads", nkv))))
    if len(shapes) != 1:
        raise ValueError(f"Gemma 4 full layers of several shapes {sorted(shapes)}: not supported")
    return shapes.pop()


def kv_sources(types: list[str], shared: int) -> tuple[int, ...]:
    """Each layer's KV owner: the last ``shared`` layers read the last earlier unshared layer of their
    type (transformers' ``kv_sharing_modes``: "reuse" reads what the "store" layer computed)."""
    first = len(types) - shared
    out = list(range(len(types)))
    for i in range(first, len(types)):
        owners = [j for j in range(first) if types[j] == types[i]]
        if not owners:
            raise ValueError(f"layer {i} shares KV but no earlier {types[i]} layer computes any")
        out[i] = owners[-1]
    return tuple(out)
