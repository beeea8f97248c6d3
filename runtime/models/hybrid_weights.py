"""Checkpoint names of Qwen3.5 / Qwen3-Next onto our fused hybrid modules.

Our Gated DeltaNet has one in-projection with rows ``[q | k | v | z | b | a]``; Qwen3.5 stores
them as ``in_proj_qkv`` / ``_z`` / ``_b`` / ``_a``, Qwen3-Next as ``in_proj_qkvz`` / ``_ba`` grouped
per key head (``[q k v z]`` of head 0, then head 1 ...), which is regrouped here once at load.
Routed experts load in ``runtime/models/weights.py`` like Qwen3-MoE's; the shared expert's gate/up fuse
here.  The multimodal Qwen3.5 checkpoint keeps the text model under ``model.language_model.``; its
vision tower and multi-token-prediction head are not loaded.
"""

from __future__ import annotations

import re

import torch

from kvreuse.runtime.models.config import ModelConfig

Part = tuple[str, slice | None, torch.Tensor]

_SKIP = ("model.visual.", "visual.", "mtp.", "model.mtp.")
_LAYER = re.compile(r"^layers\.(\d+)\.(self_attn|linear_attn|mlp|mlp\.shared_expert)\.(\w+)\.(weight|bias)$")


def map_hybrid_weight(cfg: ModelConfig, name: str, w: torch.Tensor) -> list[Part]:
    """(parameter name, rows or None, tensor) parts for one checkpoint tensor; [] for ignored ones."""
    if name.startswith(_SKIP) or "rotary_emb" in name:
        return []
    for prefix in ("model.language_model.", "model."):
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    m = _LAYER.match(name)
    if m is None:
        return [(name, None, w)]
    layer, block, proj, kind = m.groups()
    base = f"layers.{layer}.{block}"
    if block.startswith("mlp") and proj in ("gate_proj", "up_proj"):
        i = (
            cfg.intermediate_size
            if block == "mlp" or cfg.moe is None
            else cfg.moe.shared_expert_intermediate_size
        )
        return [(f"{base}.gate_up_proj.{kind}", _rows(i if proj == "up_proj" else 0, i), w)]
    if block == "self_attn" and proj in ("q_proj", "k_proj", "v_proj"):
        q, kv = 2 * cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        start = {"q_proj": 0, "k_proj": q, "v_proj": q + kv}[proj]
        return [(f"{base}.qkv_proj.{kind}", _rows(start, w.shape[0]), w)]
    if block == "linear_attn":
        return _linear_attn(cfg, base, proj, kind, w)
    return [(name, None, w)]


def _rows(start: int, n: int) -> slice:
    return slice(start, start + n)


def _linear_attn(cfg: ModelConfig, base: str, proj: str, kind: str, w: torch.Tensor) -> list[Part]:
    lc = cfg.linear_attn
    assert lc is not None
    target = f"{base}.in_proj.weight"
    z0 = lc.conv_dim
    b0 = z0 + lc.value_dim
    a0 = b0 + lc.num_v_heads
    if proj == "in_proj_qkv":
        return [(target, _rows(0, lc.conv_dim), w)]
    if proj == "in_proj_z":
        return [(target, _rows(z0, lc.value_dim), w)]
    if proj in ("in_proj_b", "in_proj_a"):
        return [(target, _rows(b0 if proj == "in_proj_b" else a0, lc.num_v_heads), w)]
    if proj == "conv1d":
        return [(f"{base}.conv_weight", None, w.reshape(w.shape[0], -1))]
    hk, dk, dv = lc.num_k_heads, lc.k_head_dim, lc.v_head_dim
    r = lc.num_v_heads // hk
    if proj == "in_proj_qkvz":  # per key head [q(dk) k(dk) v(r*dv) z(r*dv)]
        q, k, v, z = w.reshape(hk, -1, w.shape[-1]).split([dk, dk, r * dv, r * dv], dim=1)
        flat = [x.reshape(-1, w.shape[-1]) for x in (q, k, v, z)]
        return [
            (target, _rows(0, lc.conv_dim), torch.cat(flat[:3])),
            (target, _rows(z0, lc.value_dim), flat[3]),
        ]
    if proj == "in_proj_ba":  # per key head [b(r) a(r)]
        b, a = w.reshape(hk, 2 * r, w.shape[-1]).split([r, r], dim=1)
        n = lc.num_v_heads
        return [(target, _rows(b0, n), b.reshape(n, -1)), (target, _rows(a0, n), a.reshape(n, -1))]
    return [(f"{base}.{proj}.{kind}", None, w)]
