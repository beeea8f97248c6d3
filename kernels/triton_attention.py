"""Triton paged-attention backend: the three kernels ``kvreuse.kernels.select_backend(..., "triton")`` loads.

Signatures and cache layout match ``kvreuse.kernels.reference``; each kernel lives in its own module:
``triton_store`` (scatter K/V into page slots), ``triton_extend`` (prefill over a cached prefix,
bottom-right causal) and ``triton_decode`` (split-K flash-decoding).  On a machine without CUDA,
set ``TRITON_INTERPRET=1`` *before* importing this module to run the kernels in Triton's interpreter.
"""

from __future__ import annotations

from kvreuse.kernels.triton_decode import decode_attention
from kvreuse.kernels.triton_extend import extend_attention
from kvreuse.kernels.triton_store import store_kv

__all__ = ["store_kv", "extend_attention", "decode_attention"]
