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
    mxfp4: bool = False  # the checkpoint's experts are MXFP4 blocks + scales, kept so (``mxfp4.py``)


def gpt_oss_fields(c: dict[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields of a gpt-oss config."""
    method = (c.get("quantization_config") or {}).get("quant_method")
    if method not in (None, "mxfp4"):
        raise ValueError(
            f"gpt-oss checkpoint quantized with {method!r}: kvreuse loads MXFP4 or unquantized experts"
        )
    return {
        "gpt_oss": GptOssConfig(
            swiglu_alpha=float(c.get("swiglu_alpha", 1.702)),
            swiglu_limit=float(c.get("swiglu_limit", 7.0)),
            mxfp4=method == "mxfp4",
        )
    }
