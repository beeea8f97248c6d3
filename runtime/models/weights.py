"""Load safetensors weights by name into our modules, fusing q/k/v, gate/up and MoE experts on the way."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open

from kvreuse.runtime.models.decoder import CausalLM
from kvreuse.runtime.models.gemma4 import gemma4_weight
from kvreuse.runtime.models.gpt_oss import gpt_oss_weight
from kvreuse.runtime.models.hybrid_weights import map_hybrid_weight

_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(self_attn|mlp|mlp\.shared_expert)\.(\w+)\.(weight|bias)$")
# one routed expert's matrix -> its slot in the layer's fused [E, ...] tensors (a multimodal Qwen3.5-MoE
# checkpoint nests its text model under model.language_model.)
_EXPERT = re.compile(
    r"^model\.(?:language_model\.)?layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$"
)


_VISION = re.compile(
    r"^(model\.)?(vision_tower|multi_modal_projector|audio_tower|embed_vision|embed_audio)\."
)


class WeightsError(Exception):
    """Weights are missing, corrupt or do not fit the architecture."""


def load_weights(model: CausalLM, model_dir: Path) -> None:
    """Copy every tensor into the (already allocated, target-dtype) module; raise WeightsError on any mismatch."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise WeightsError(f"no *.safetensors files in {model_dir}")
    params = dict(model.named_parameters())
    seen: set[str] = set()
    for f in files:
        try:
            handle = safe_open(str(f), framework="pt")
        except Exception as e:
            raise WeightsError(f"cannot read weights file {f.name}: {e}".splitlines()[0]) from e
        with handle:
            for name in handle.keys():
                _load_one(model, params, name, handle.get_tensor(name), seen)
    missing = [
        n for n in params if n not in seen and not (n == "lm_head.weight" and model.cfg.tie_word_embeddings)
    ]
    if missing:
        raise WeightsError(f"weights missing from {model_dir}: {', '.join(missing[:4])}")


def _load_one(model: CausalLM, params: dict, name: str, w: torch.Tensor, seen: set[str]) -> None:
    cfg = model.cfg
    e = _EXPERT.match(name)
    if e:
        _load_expert(params, e, w, name, seen)
        return
    if cfg.gpt_oss is not None:
        name, w = gpt_oss_weight(name, w)
    if cfg.gemma is not None:  # the multimodal checkpoint nests the text model; its vision tower is not ours
        if _VISION.match(name):
            return
        name = name.replace("model.language_model.", "model.", 1)
    if cfg.gemma4 is not None:  # MoE Gemma 4's router and experts sit in our layer's ``moe``
        name = gemma4_weight(name)
    if cfg.is_hybrid:  # its own name map (fused linear-attention projections, gated q_proj)
        for key, rows, part in map_hybrid_weight(cfg, name, w):
            if key == "lm_head.weight" and cfg.tie_word_embeddings:
                continue
            if key not in params:
                raise WeightsError(f"unexpected weight {name} for a {cfg.model_type} model")
            _copy(params[key].data if rows is None else params[key].data[rows], part, name)
            seen.add(key)
        return
    if name.startswith("model."):
        short = name[len("model.") :]
    else:
        short = name
    m = _LAYER.match(name)
    if m and m.group(3) in _FUSED and not (cfg.gemma4 is not None and m.group(2) == "self_attn"):
        target, idx = _FUSED[m.group(3)]
        key = f"layers.{m.group(1)}.{m.group(2)}.{target}.{m.group(4)}"
        p = params[key]
        if target == "qkv_proj":
            q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
            offsets = [0, q, q + kv, q + 2 * kv]
        else:  # a shared expert's width differs from the dense MLP's: take it from the fused tensor
            half = p.shape[0] // 2
            offsets = [0, half, 2 * half]
        rows = slice(offsets[idx], offsets[idx + 1])
        _copy(p.data[rows], w, name)
        seen.add(key)  # a fused tensor counts once any part is loaded; shapes are checked per part
        return
    if short == "lm_head.weight" and cfg.tie_word_embeddings:
        return
    if short.startswith("rotary_emb") or "rotary_emb.inv_freq" in short:
        return
    if short not in params:
        raise WeightsError(f"unexpected weight {name} for a {cfg.model_type} model")
    _copy(params[short].data, w, name)
    seen.add(short)


def _load_expert(params: dict, m: re.Match, w: torch.Tensor, name: str, seen: set[str]) -> None:
    layer, expert, proj = m.group(1), int(m.group(2)), m.group(3)
    key = f"layers.{layer}.mlp.experts.{'down_proj' if proj == 'down_proj' else 'gate_up_proj'}"
    if key not in params:
        raise WeightsError(f"unexpected weight {name}: layer {layer} has no routed experts")
    p = params[key]
    if expert >= p.shape[0]:
        raise WeightsError(f"weight {name}: expert {expert} out of range (config has {p.shape[0]} experts)")
    dst = p.data[expert]
    if proj != "down_proj":
        half = dst.shape[0] // 2
        dst = dst[:half] if proj == "gate_proj" else dst[half:]
    _copy(dst, w, name)
    seen.add(key)


def _copy(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if dst.shape != src.shape:
        raise WeightsError(f"weight {name} has shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
    dst.copy_(src.to(dst.dtype))
