"""The MXFP4 expert linears (``kernels/cpu/mxfp4.c``) through ctypes: gpt-oss's experts at decode read
their 4.25-bit blocks directly instead of a decoded copy, every expert a step picked in one call.
``load`` returns ``None`` where the C kernels cannot build (the caller then decodes with torch,
``runtime/models/mxfp4.py``, also the oracle).

fp32 activations multiply in fp32 (the dense matmul's result up to summation order); bf16 / fp16
ones are quantized to int8 per block of 32 first and multiplied as integers (llama.cpp's MXFP4 x Q8_0),
whose error against the exact product is bounded by ``q8_error_bound``."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kvreuse.kernels.cpu_build import compile_library

MAX_ROWS = 8  # rows of one expert: the kernel keeps one accumulator per row
_P, _I = ctypes.c_void_p, ctypes.c_int64


class Mxfp4Experts:
    """``x [rows, in]`` whose consecutive runs of rows (``counts``, each 1..8) go to ``experts`` of an
    MXFP4 stack ``blocks [E, out, in/2]`` + ``scales [E, out, in/32]`` -> fp32 ``[rows, out]``."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fns = {}
        for dtype, name in ((torch.float32, "mxfp4_experts_f32"), (None, "mxfp4_experts_q8")):
            fn = getattr(lib, name)
            fn.restype = ctypes.c_int
            fn.argtypes = [_P, _I, _P, _P, _I, _P, _P, _I, _P]
            self._fns[dtype] = fn

    def __call__(
        self, x: torch.Tensor, counts: torch.Tensor, experts: torch.Tensor, blocks: torch.Tensor,
        scales: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        fn = self._fns.get(x.dtype, self._fns[None])  # fp32 exact; any narrower float through Q8
        x = x.float().contiguous()
        rows, n = x.shape
        out = blocks.shape[1]
        assert blocks.is_contiguous() and scales.is_contiguous() and blocks.shape[2] * 2 == n
        bounds = torch.zeros(len(counts) + 1, dtype=torch.int64)
        torch.cumsum(counts.to(torch.int64), 0, out=bounds[1:])
        assert int(bounds[-1]) == rows
        ids = experts.to(torch.int64).contiguous()
        y = torch.empty(rows, out, dtype=torch.float32)
        rc = fn(x.data_ptr(), n, bounds.data_ptr(), ids.data_ptr(), len(ids), blocks.data_ptr(),
                scales.data_ptr(), out, y.data_ptr())  # fmt: skip
        if rc == -2:
            raise MemoryError("mxfp4 experts: out of memory")
        if rc != 0:
            raise ValueError(
                f"mxfp4 experts: groups of {counts.tolist()} rows of {n} "
                f"(1 to {MAX_ROWS} rows an expert, width a multiple of 32)"
            )
        return y


def q8_error_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``[rows, out]``: how far the Q8 path's ``x @ w.T`` may be from the exact one.  Each activation
    is rounded to its block's step ``max|x| / 127``, so off by at most half of it; a block's products
    move by at most that times ``sum |w|`` over the block (fp32 summation adds far less)."""
    rows, n = x.shape
    half_step = x.float().abs().view(rows, n // 32, 32).amax(-1) / 127 / 2  # [rows, blocks]
    wabs = w.float().abs().view(w.shape[0], n // 32, 32).sum(-1)  # [out, blocks]
    return half_step @ wabs.T


def load() -> Mxfp4Experts | None:
    lib = compile_library(Path(__file__).parent / "cpu" / "mxfp4.c")
    return None if lib is None else Mxfp4Experts(lib)
