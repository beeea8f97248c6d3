"""Attention kernels over the paged KV pool, chosen by device.

``reference`` (pure torch) runs everywhere and is the oracle; ``triton`` runs on CUDA.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch


class AttentionBackend(NamedTuple):
    """The three kernels the model runner calls; see ``kernels/reference.py`` for the layout."""

    name: str
    store_kv: Callable
    extend_attention: Callable
    decode_attention: Callable
    decode_plan: Callable | None  # per-step metadata shared by all layers, passed as ``plan=``


def select_backend(device: torch.device | str, name: str = "auto") -> AttentionBackend:
    """``auto`` picks Triton on CUDA when importable, else the torch reference."""
    device = torch.device(device)
    if name == "auto":
        name = "triton" if device.type == "cuda" and _triton_available() else "reference"
    if name == "reference":
        from kernels import reference as r

        return AttentionBackend(
            "reference", r.store_kv, r.extend_attention, r.decode_attention, r.decode_plan
        )
    if name == "triton":
        from kernels import triton_attention as t

        return AttentionBackend("triton", t.store_kv, t.extend_attention, t.decode_attention, None)
    raise ValueError(f"unknown attention backend {name!r} (expected auto, reference or triton)")


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
