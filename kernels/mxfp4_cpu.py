"""The MXFP4 few-row linear (``kernels/cpu/mxfp4.c``) through ctypes: gpt-oss's experts at decode read
their 4.25-bit blocks directly instead of a decoded copy.  ``load`` returns ``None`` where the C kernels
cannot build (the caller then decodes with torch, ``runtime/models/mxfp4.py``, also the oracle)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kernels.cpu_build import compile_library

MAX_ROWS = 8  # the kernel keeps one accumulator per row
_P, _I = ctypes.c_void_p, ctypes.c_int64


class Mxfp4Linear:
    """``x [rows <= 8, in]`` (any float dtype) times an MXFP4 ``[out, in]`` matrix -> fp32 ``[rows, out]``."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = lib.mxfp4_linear
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [_P, _I, _I, _P, _P, _I, _P]

    def __call__(self, x: torch.Tensor, blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        x = x.float().contiguous()
        rows, n = x.shape
        out = blocks.shape[0]
        assert blocks.is_contiguous() and scales.is_contiguous() and blocks.shape[1] * 2 == n
        y = torch.empty(rows, out, dtype=torch.float32)
        rc = self._fn(x.data_ptr(), rows, n, blocks.data_ptr(), scales.data_ptr(), out, y.data_ptr())
        if rc != 0:
            raise ValueError(
                f"mxfp4_linear: {rows} rows of {n} (at most {MAX_ROWS} rows, width a multiple of 32)"
            )
        return y


def load() -> Mxfp4Linear | None:
    lib = compile_library(Path(__file__).parent / "cpu" / "mxfp4.c")
    return None if lib is None else Mxfp4Linear(lib)
