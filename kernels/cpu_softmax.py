"""Row softmax of bf16 attention scores with the causal corner, as one small C kernel (AVX512-BF16).

After the bf16 GEMMs, ``torch.softmax`` (exp at ~2 cycles an element) plus the ``-inf`` fill is a
third of the CPU extend attention.  The scores only need a bf16-accurate exp, so this kernel uses a
degree-5 polynomial (relative error ~3e-6, far below bf16's 4e-3 rounding), reads the causal limit
of each row from its index (no mask pass), and writes ``exp(s - max)`` unnormalised: the caller
divides the ``p v`` rows by the returned sums (``rows x D`` instead of ``rows x keys``).

The source is ``kernels/cpu/softmax_rows.c``, built and loaded by ``kernels/cpu_build.py`` (as the
fused decode kernels are); threads are OpenMP's, the same libgomp torch loaded.  Where it cannot
be built or the CPU lacks AVX512-BF16, ``load()`` returns None and the caller stays on torch.
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import torch

from kvreuse.kernels.cpu_build import compile_library

SOURCE = Path(__file__).with_name("cpu") / "softmax_rows.c"


@cache  # called by every bf16 extend attention call: configure the library once, not per call
def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None (no compiler, a failed build, or no AVX512-BF16 on this CPU)."""
    lib = compile_library(SOURCE)
    if lib is None or not lib.kv_supported():
        return None
    i64 = ctypes.c_int64
    lib.kv_softmax_rows.argtypes = [ctypes.c_void_p, ctypes.c_void_p, i64, i64, i64, i64, i64, i64]
    lib.kv_softmax_rows.restype = None
    return lib


def softmax_rows_(lib: ctypes.CDLL, s: torch.Tensor, prefix: int, row0: int, group: int) -> torch.Tensor:
    """In place on bf16 ``s [rows, cols]`` (rows contiguous): unnormalised exp; returns the fp32 row sums."""
    rows, cols = s.shape
    assert s.dtype == torch.bfloat16 and s.stride(1) == 1
    sums = torch.empty(rows, 1, dtype=torch.float32)
    lib.kv_softmax_rows(s.data_ptr(), sums.data_ptr(), rows, s.stride(0), cols, prefix, row0, group)
    return sums
