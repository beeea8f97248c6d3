"""Attention kernels over the paged KV pool, chosen by device.

``reference`` (pure torch) runs everywhere and is the oracle; ``triton`` runs on CUDA; ``cpu`` is the
reference plus the C kernels of ``kernels/native_cpu.py``: fused decode layers and paged decode
attention, and bf16 extend attention as a flash kernel (built with the machine's C compiler; ``auto``
falls back to ``reference`` where they cannot be built).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch


class AttentionBackend(NamedTuple):
    """The three kernels the model runner calls; see ``kernels/reference.py`` for the layout."""

    name: str
    store_kv: Callable
    extend_attention: Callable
    decode_attention: Callable
    decode_plan: Callable | None  # per-step metadata shared by all layers, passed as ``plan=``
    fused: Any = None  # ``NativeOps``: a decode step's layers as fused CPU kernels (``cpu`` only)


def select_backend(device: torch.device | str, name: str = "auto") -> AttentionBackend:
    """``auto`` picks Triton on CUDA when importable, the fused kernels on CPU when they build, else the
    torch reference."""
    device = torch.device(device)
    ops = _native_ops() if device.type == "cpu" and name in ("auto", "cpu") else None
    if name == "auto":
        if device.type == "cuda":
            name = "triton" if _triton_available() else "reference"
        else:
            name = "cpu" if ops is not None else "reference"
    if name == "cpu":
        from kvreuse.kernels import reference as r

        if ops is None:
            raise ValueError("attention backend 'cpu' needs a CPU device and a C compiler (cc/gcc)")
        return AttentionBackend(
            "cpu", r.store_kv, ops.extend_attention, ops.paged_decode_attention, None, ops
        )
    if name == "reference":
        from kvreuse.kernels import reference as r

        return AttentionBackend(
            "reference", r.store_kv, r.extend_attention, r.decode_attention, r.decode_plan
        )
    if name == "triton":
        from kvreuse.kernels import triton_attention as t

        return AttentionBackend("triton", t.store_kv, t.extend_attention, t.decode_attention, None)
    raise ValueError(f"unknown attention backend {name!r} (expected auto, reference, cpu or triton)")


def _native_ops() -> Any:
    from kvreuse.kernels.native_cpu import load

    return load()


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
