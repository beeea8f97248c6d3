"""The config facts of gpt-oss (``model_type: gpt_oss``) beyond the Llama shape."""

from __future__ import annotations

from typing import Any, NamedTuple

GPT_OSS = {"gpt_oss": "gpt-oss (20b, 120b)"}


class GptOssConfig(NamedTuple):
    """The experts' clamped SwiGLU: ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)`` with
    ``g = clamp(gate, max=limit)``.  The rest is implied by the family: a learned sink logit per query
    head, biases on every attention projection (o too), a router with a bias, biased experts."""

    swiglu_alpha: float
    swiglu_limit: float


def gpt_oss_fields(c: dict[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields of a gpt-oss config."""
    if c.get("quantization_config"):
        method = c["quantization_config"].get("quant_method", "?")
        raise ValueError(
            f"gpt-oss checkpoint quantized with {method!r}: kvreuse loads the bf16/fp32 (dequantized) "
            "weights only; save the model dequantized (transformers: Mxfp4Config(dequantize=True))"
        )
    return {
        "gpt_oss": GptOssConfig(
            swiglu_alpha=float(c.get("swiglu_alpha", 1.702)),
            swiglu_limit=float(c.get("swiglu_limit", 7.0)),
        )
    }
