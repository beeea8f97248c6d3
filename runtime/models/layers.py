"""Building blocks shared by every supported architecture."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kvreuse.runtime.models.linear import Linear


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 like the reference implementations, cast back to the input dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if dtype == torch.float32:  # one fused op instead of six: decode is dispatch-bound on CPU
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class Fp32RMSNorm(nn.Module):
    """RMSNorm scaled by ``offset + weight`` in fp32, cast to the input's dtype after the scale (Gemma 4's
    norms: offset 0)."""

    offset = 0.0

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - self.offset))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.float() + self.offset
        return F.rms_norm(x.float(), w.shape, w, self.eps).to(x.dtype)


class OffsetRMSNorm(Fp32RMSNorm):
    """RMSNorm scaled by ``1 + weight`` (weights stored zero-centred: Gemma 3, Qwen3.5), in fp32, cast to
    the input's dtype after the scale."""

    offset = 1.0


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies, with the llama3, linear and YaRN scalings that our supported models use."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return inv
    kind = scaling["rope_type"]
    if kind == "proportional":  # Gemma 4: the first fraction of the frequencies rotate, the rest stay put
        rotated = int(float(scaling.get("partial_rotary_factor", 1.0)) * head_dim // 2)
        inv[rotated:] = 0.0
        return inv / float(scaling.get("factor", 1.0))
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    if kind == "yarn":
        return _yarn_inv_freq(inv, head_dim, theta, scaling)
    raise ValueError(
        f"unsupported rope scaling {kind!r} (supported: default, linear, llama3, yarn, proportional)"
    )


def _yarn_inv_freq(inv: torch.Tensor, dim: int, theta: float, scaling: dict[str, Any]) -> torch.Tensor:
    """YaRN (gpt-oss): high frequencies kept, low ones interpolated by ``factor``, a linear ramp between
    the dimensions where ``beta_fast`` and ``beta_slow`` rotations fit the original context
    (transformers' ``_compute_yarn_parameters``, its ``truncate`` default included)."""
    factor = float(scaling["factor"])
    old_ctx = float(scaling["original_max_position_embeddings"])

    def dim_of(rotations: float) -> float:
        return (dim * math.log(old_ctx / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = dim_of(scaling.get("beta_fast") or 32), dim_of(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # share of the original (extrapolated) frequency
    return (inv / factor) * (1 - keep) + inv * keep


def rope_attention_factor(scaling: dict[str, Any] | None) -> float:
    """The factor YaRN scales cos and sin by (``0.1 ln(factor) + 1`` unless the config names one); 1 else."""
    if not scaling or scaling["rope_type"] != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling["factor"])

    def mscale(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return mscale(float(scaling["mscale"])) / mscale(float(scaling["mscale_all_dim"]))
    return mscale(1.0)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position, indexed by each token's absolute position."""

    def __init__(self, head_dim: int, max_pos: int, theta: float, scaling: dict[str, Any] | None) -> None:
        super().__init__()
        if torch.get_default_device().type == "meta":
            # build_model's skeleton, whose tables it recomputes on the real device; arithmetic on meta
            # tensors imports torch._dynamo (~1.7 s a process), so only the shapes are made here
            self.register_buffer("cos", torch.empty(max_pos, (head_dim + 1) // 2), persistent=False)
            self.register_buffer("sin", torch.empty(max_pos, (head_dim + 1) // 2), persistent=False)
            return
        inv = rope_inv_freq(head_dim, theta, scaling)
        t = torch.arange(max_pos, dtype=torch.float32)
        freqs = torch.outer(t, inv)
        scale = rope_attention_factor(scaling)
        self.register_buffer("cos", freqs.cos() * scale, persistent=False)
        self.register_buffer("sin", freqs.sin() * scale, persistent=False)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[T, 1, head_dim/2]`` for a step, looked up once and shared by every layer."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [T, heads, head_dim] in HF's non-interleaved halves convention, in fp32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class GatedMLP(nn.Module):
    """SwiGLU MLP with gate and up projections fused into one matmul."""

    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden, 2 * inter, bias=False)
        self.down_proj = Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.run(x).chunk(2, dim=-1)
        return self.down_proj.run(F.silu(gate) * up)
