"""Swap a loaded model's decoder linears for weight-only quantized ones: from dense weights
(``--quantize int8|int4``) or from a GGUF file's own blocks (``--quantize gguf``).

GGUF mapping (``W`` as llama.cpp dequantizes it, per group of 32 along the input dimension):

* ``Q4_0`` ``d * (q - 8)``, ``Q4_1`` ``d * q + m``, ``Q4_K`` ``d*sc * q - dmin*m``: the same 4-bit codes
  and the same grid in our int4 layout (``scale = d``, ``zero = low + 8 * scale``); only the scale and
  zero are rounded to bf16 for the kernel.
* ``Q8_0`` (per-32 scales) and ``Q6_K`` (6 bits, per-16 scales): requantized to int8 per output row.
* anything else (F32, F16, other K-quants): requantized to int8 from llama.cpp's dequantization.

The token embedding stays dense (a lookup reads a few rows).  The LM head (``output``, or the tied
``token_embd``) is kept as the file's own blocks where the fused CPU kernels are built: ``Q8_0`` as
:class:`~kvreuse.runtime.models.block_int8.BlockInt8Linear`, 4-bit grids as int4; otherwise it stays dense.
Requantizing a dense head is not done: an int4 head from min/max per group cost +3.7% perplexity on
the fixed text of ``kvreuse.benchmarks.kernels.quantized`` (the budget is 1%), and torch's per-row int8 kernel is no
faster than the packed bf16 head for one row (``runtime/models/quant_linear.py``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from kvreuse.kernels.native_cpu import load as load_native
from kvreuse.runtime.models.block_int8 import BlockInt8Linear
from kvreuse.runtime.models.decoder import CausalLM
from kvreuse.runtime.models.linear import Linear
from kvreuse.runtime.models.quant_linear import (
    GROUP,
    DequantScratch,
    QuantLinear,
    int4_from_grid,
    quantize_int4,
    quantize_int8,
)

MODES = ("none", "int8", "int4", "gguf")
_PARTS = {  # GGUF tensor -> (our module, its slot in the fused weight)
    "attn_q": ("self_attn.qkv_proj", 0),
    "attn_k": ("self_attn.qkv_proj", 1),
    "attn_v": ("self_attn.qkv_proj", 2),
    "attn_output": ("self_attn.o_proj", 0),
    "ffn_gate": ("mlp.gate_up_proj", 0),
    "ffn_up": ("mlp.gate_up_proj", 1),
    "ffn_down": ("mlp.down_proj", 0),
}


def _decoder_linears(model: CausalLM) -> dict[str, Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, Linear) and n.startswith("layers.")}


def _install(model: CausalLM, name: str, q: QuantLinear | BlockInt8Linear) -> None:
    if isinstance(q, QuantLinear):  # the block head dequantizes only for prompt scoring, on its own
        scratch = next((m.scratch for m in model.modules() if isinstance(m, QuantLinear)), None)
        q.scratch = scratch or DequantScratch(load_native())
        q.use_native(q.scratch.ops)
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent), attr, q)


def verifies_per_row(model: CausalLM) -> bool:
    """Whether every quantized linear multiplies a few rows through the CPU kernels that read each
    weight block once for all rows (``QuantLinear.use_native``): a draft's verification then costs
    about a decode step.  False where int8 linears (torch's per-row kernel) or the torch int4 kernel
    remain (no compiler): their cost grows with every drafted row.  True for dense models."""
    return all(m.native is not None for m in model.modules() if isinstance(m, QuantLinear))


def quantize_dense(model: CausalLM, kind: str) -> None:
    """Replace every decoder linear by an int8 / int4 copy of its (already loaded) weight."""
    for name, lin in _decoder_linears(model).items():
        w, b = lin.weight.detach().float(), None if lin.bias is None else lin.bias.detach()
        q = quantize_int4(w, b) if kind == "int4" and w.shape[1] % GROUP == 0 else quantize_int8(w, b)
        _install(model, name, q)


def _grid(t) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(dequantized W [rows, cols] fp32, per-group scale, per-group low) of one GGUF tensor; no grid
    (None, None) unless its blocks are 4-bit codes on a per-32 affine grid."""
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    blocks = np.asarray(t.data)
    rows = blocks.shape[0]
    w = torch.from_numpy(np.ascontiguousarray(quants.dequantize(blocks, t.tensor_type), dtype=np.float32))
    w = w.reshape(rows, -1)
    kind = t.tensor_type
    if kind in (T.Q4_0, T.Q4_1):
        b = blocks.reshape(rows, -1, 18 if kind == T.Q4_0 else 20)
        d = torch.from_numpy(np.ascontiguousarray(b[..., 0:2]).view(np.float16)[..., 0].astype(np.float32))
        if kind == T.Q4_0:
            return w, d, -8 * d
        m = torch.from_numpy(np.ascontiguousarray(b[..., 2:4]).view(np.float16)[..., 0].astype(np.float32))
        return w, d, m
    if kind == T.Q4_K:
        b = blocks.reshape(-1, 144)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        dmin = b[:, 2:4].copy().view(np.float16).astype(np.float32)
        sc, mn = quants.Q4_K.get_scale_min(b[:, 4:16].copy())
        scale = torch.from_numpy((d * sc.astype(np.float32)).reshape(rows, -1))
        low = torch.from_numpy((-dmin * mn.astype(np.float32)).reshape(rows, -1))
        return w, scale, low
    return w, None, None


def _unpermute_rows(n_rows: int, n_head: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k rotary permutation (as transformers' GGUF loader does)."""
    idx = torch.arange(n_rows).view(n_head, n_rows // n_head // 2, 2)
    return idx.transpose(1, 2).reshape(-1)


def quantize_from_gguf(model: CausalLM, gguf_path: Path) -> dict[str, str]:
    """Replace every decoder linear by one built from the GGUF's own blocks; returns {tensor: handling}."""
    from gguf import GGUFReader

    cfg = model.cfg
    reader = GGUFReader(str(gguf_path))
    parts: dict[str, list] = {}
    report: dict[str, str] = {}
    for t in reader.tensors:
        pieces = t.name.split(".")
        if len(pieces) != 4 or pieces[0] != "blk" or pieces[2] not in _PARTS or pieces[3] != "weight":
            continue
        module, slot = _PARTS[pieces[2]]
        w, scale, low = _grid(t)
        if cfg.model_type == "llama" and pieces[2] in ("attn_q", "attn_k"):
            heads = cfg.num_heads if pieces[2] == "attn_q" else cfg.num_kv_heads
            order = _unpermute_rows(w.shape[0], heads)
            w = w[order]
            scale, low = (None, None) if scale is None else (scale[order], low[order])
        parts.setdefault(f"layers.{pieces[1]}.{module}", []).append((slot, w, scale, low))
        report[t.name] = f"{t.tensor_type.name} -> {'int4' if scale is not None else 'int8 (requantized)'}"
    linears = _decoder_linears(model)
    if set(parts) != set(linears):
        missing = sorted(set(linears) - set(parts))[:3]
        raise ValueError(f"{gguf_path.name}: no GGUF tensors for {', '.join(missing)}")
    for name, got in parts.items():
        got.sort(key=lambda p: p[0])
        lin = linears[name]
        w = torch.cat([p[1] for p in got])
        if tuple(w.shape) != (lin.out_features, lin.in_features):
            raise ValueError(f"{gguf_path.name}: {name} is {tuple(w.shape)}, the model wants "
                             f"{(lin.out_features, lin.in_features)}")  # fmt: skip
        bias = None if lin.bias is None else lin.bias.detach()
        if all(p[2] is not None for p in got):
            q = int4_from_grid(w, torch.cat([p[2] for p in got]), torch.cat([p[3] for p in got]), bias)
        else:  # a fused weight mixing 4-bit and other blocks (e.g. Q4_K_M's Q6_K attn_v): int8 for all
            q = quantize_int8(w, bias)
        _install(model, name, q)
    head = _head_from_gguf(reader)
    if head is not None:
        _install(model, "lm_head", head[1])
        report[head[0]] = head[2]
    return report


def _head_from_gguf(reader) -> tuple[str, torch.nn.Module, str] | None:
    """The LM head as the file's own blocks (tensor name, module, handling), or None: stays dense."""
    from gguf import GGMLQuantizationType as T

    by_name = {t.name: t for t in reader.tensors}
    t = by_name.get("output.weight", by_name.get("token_embd.weight"))
    ops = load_native()
    if t is None or ops is None:
        return None
    if t.tensor_type == T.Q8_0:
        b = np.asarray(t.data).reshape(t.shape[-1], -1, 34)  # per block: fp16 scale, 32 int8 codes
        scale = torch.from_numpy(
            np.ascontiguousarray(b[..., 0:2]).view(np.float16)[..., 0].astype(np.float32)
        )
        codes = torch.from_numpy(np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(b.shape[0], -1))
        return t.name, BlockInt8Linear(codes, scale, ops), "Q8_0 -> int8 blocks (LM head)"
    w, scale, low = _grid(t)
    if scale is None:
        return None
    return t.name, int4_from_grid(w, scale, low, None), f"{t.tensor_type.name} -> int4 (LM head)"


def gguf_source(model_dir: Path) -> Path | None:
    """The GGUF a converted model directory came from (``model_source.convert_gguf`` records it)."""
    marker = Path(model_dir) / ".complete"
    if not marker.is_file():
        return None
    p = Path(marker.read_text().strip())
    return p if p.suffix == ".gguf" and p.is_file() else None


def apply_quantization(model: CausalLM, mode: str, model_dir: Path) -> None:
    """``none`` | ``int8`` | ``int4`` | ``gguf`` (the source GGUF's own blocks; an error without one)."""
    if mode not in MODES:
        raise ValueError(f"unknown quantization {mode!r} (expected one of {', '.join(MODES)})")
    if mode == "none":
        return
    if next(model.parameters()).device.type != "cpu":
        raise ValueError(f"--quantize {mode} runs on CPU only (torch's packed int4/int8 CPU kernels)")
    if mode == "gguf":
        src = gguf_source(model_dir)
        if src is None:
            raise ValueError(f"--quantize gguf needs a model loaded from a .gguf file ({model_dir} is not)")
        quantize_from_gguf(model, src)
    else:
        quantize_dense(model, mode)
