"""The CPU kernels of ``kernels/cpu/``: fused decode ops (``decode_ops.c``), the Q8_0 linear
(``q8_linear.c``), the int4 linear for a few rows (``q4_linear.c``), flash extend attention in bf16 (``extend_attention.c``, AVX512-BF16) and fp32
(``extend_attention_f32.c``, AVX-512 / AVX2 / portable, windows too) and the quantized linears' weight
dequantization for prefill (``dequant.c``), built by ``kernels/cpu_build.py``.

:func:`load` returns ``None`` where there is no compiler or the build fails; every caller then keeps
its torch path, which is also the oracle the kernels are tested against (``tests/test_native_cpu.py``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import torch

from kvreuse.kernels import reference
from kvreuse.kernels.cpu_build import compile_library

SOURCES = [
    Path(__file__).with_name("cpu") / f
    for f in (
        "decode_ops.c",
        "q8_linear.c",
        "q4_linear.c",
        "extend_attention.c",
        "extend_attention_f32.c",
        "dequant.c",
    )
]
Q4_ROWS = 32  # q4_linear.c's ROWS_MAX and q8_linear.c's TILE_ROWS_MAX
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    "rms_norm": (None, [_P, _P, _P, _P, _I, _I, _F]),
    "silu_mul": (None, [_P, _P, _I, _I]),
    "rope_store": (None, [_P, _I, _I, _I, _I, _P, _P, _P, _P, _F, _P, _P, _P]),
    "q8_linear": (ctypes.c_int, [_P, _I, _P, _P, _I, _I, _P]),
    "q4_linear": (ctypes.c_int, [_P, _I, _P, _P, _I, _I, _P]),
    "q8_tiles": (ctypes.c_int, [_P, _I, _P, _P, _I, _I, _P]),
    "decode_attention": (ctypes.c_int, [_P, _I, _P, _P, _P, _I, _P, _I, _I, _I, _I, _I, _F, _I, _P, _P]),
    "dequant_int4": (None, [_P, _P, _P, _I, _I, _P]),
    "dequant_int8": (None, [_P, _P, _I, _I, _P]),
}


class NativeOps:
    """Typed entry points of the loaded library, one per (kernel, dtype)."""

    def __init__(self, libs: list[ctypes.CDLL]) -> None:
        self.fns: dict[tuple[str, torch.dtype], ctypes._CFuncPtr] = {}
        for name, (res, argtypes) in _SIGNATURES.items():
            for dtype, suf in _SUFFIX.items():
                fn = next(getattr(lib, f"{name}_{suf}") for lib in libs if hasattr(lib, f"{name}_{suf}"))
                fn.restype, fn.argtypes = res, argtypes
                self.fns[name, dtype] = fn
        ext = next(lib for lib in libs if hasattr(lib, "extend_attention_bf16"))
        # built without AVX512-BF16 (another CPU): bf16 extends stay on the reference's GEMM path
        self.extend_bf16 = ext.extend_attention_bf16 if ext.extend_supported() else None
        if self.extend_bf16 is not None:
            self.extend_bf16.restype = ctypes.c_int
            self.extend_bf16.argtypes = [_P, _I, _P, _P, _P, _I, _P, _P, _I, _I, _I, _I, _I, _F, _P, _P]
        # fp32 builds on every CPU (AVX-512, AVX2 or portable vectors); it also takes a window
        self.extend_f32 = next(
            lib for lib in libs if hasattr(lib, "extend_attention_f32")
        ).extend_attention_f32
        self.extend_f32.restype = ctypes.c_int
        self.extend_f32.argtypes = [_P, _I, _P, _P, _P, _I, _P, _P, _I, _I, _I, _I, _I, _F, _I, _P, _P]

    def supports(self, t: torch.Tensor) -> bool:
        return t.device.type == "cpu" and t.dtype in _SUFFIX

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``weight * norm(x)`` per row; with ``residual``, first ``x += residual`` in place (x is the stream)."""
        out = torch.empty_like(x)
        rows, dim = x.shape
        res = None if residual is None else residual.data_ptr()
        self.fns["rms_norm", x.dtype](x.data_ptr(), res, weight.data_ptr(), out.data_ptr(), rows, dim, eps)
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of ``[rows, 2 * inter]`` rows laid out ``[gate | up]``."""
        rows, width = gate_up.shape
        out = gate_up.new_empty(rows, width // 2)
        self.fns["silu_mul", gate_up.dtype](gate_up.data_ptr(), out.data_ptr(), rows, width // 2)
        return out

    def rope_store(self, qkv: torch.Tensor, nh: int, nkv: int, d: int, cos: torch.Tensor, sin: torch.Tensor,
                   q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float,
                   k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor) -> None:  # fmt: skip
        """In place on ``qkv`` rows: (q/k norm and) rotate q and k; then k and v go to their slots."""
        qn = None if q_norm is None else q_norm.data_ptr()
        kn = None if k_norm is None else k_norm.data_ptr()
        self.fns["rope_store", qkv.dtype](qkv.data_ptr(), qkv.shape[0], nh, nkv, d, cos.data_ptr(),
                                          sin.data_ptr(), qn, kn, eps, k_cache.data_ptr(),
                                          v_cache.data_ptr(), slots.data_ptr())  # fmt: skip

    def q8_linear(self, x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """``x [rows, k] @ W^T`` for ``W`` as GGUF Q8_0 blocks: int8 ``codes [n, k]``, fp32 ``scales [n, k/32]``."""
        x = x.contiguous()
        y = x.new_empty(x.shape[0], codes.shape[0])
        rc = self.fns["q8_linear", x.dtype](x.data_ptr(), x.shape[0], codes.data_ptr(), scales.data_ptr(),
                                            codes.shape[0], codes.shape[1], y.data_ptr())  # fmt: skip
        if rc != 0:
            raise MemoryError("q8_linear: out of memory")
        return y

    def q8_tiles(self, x: torch.Tensor, tiles: torch.Tensor, scales: torch.Tensor, n: int) -> torch.Tensor:
        """``q8_linear`` for up to ``Q4_ROWS`` rows with the blocks in tiles of 16 outputs
        (``BlockInt8Linear``): each row costs a fraction of q8_linear's, and its result is the same
        whatever the row count."""
        return self._tiled("q8_tiles", x, tiles, scales, n)

    def q4_linear(
        self, x: torch.Tensor, tiles: torch.Tensor, scale_low: torch.Tensor, n: int
    ) -> torch.Tensor:
        """``x [rows <= Q4_ROWS, k] @ W^T`` for ``QuantLinear``'s int4 weight in the kernel's tiles
        (``QuantLinear.use_native``); each row's result is the same whatever the row count."""
        return self._tiled("q4_linear", x, tiles, scale_low, n)

    def _tiled(
        self, name: str, x: torch.Tensor, tiles: torch.Tensor, params: torch.Tensor, n: int
    ) -> torch.Tensor:
        """One call of a row-tiled kernel (same signature for both block formats): -2 is out of
        memory, any other non-zero a shape it does not take."""
        x = x.contiguous()
        y = x.new_empty(x.shape[0], n)
        rc = self.fns[name, x.dtype](x.data_ptr(), x.shape[0], tiles.data_ptr(), params.data_ptr(), n,
                                     x.shape[1], y.data_ptr())  # fmt: skip
        if rc == -2:
            raise MemoryError(f"{name}: out of memory")
        if rc != 0:
            raise ValueError(f"{name}: unsupported shape {tuple(x.shape)} (rows <= {Q4_ROWS}, k % 32 == 0)")
        return y

    def dequantize(
        self, codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor | None, out: torch.Tensor
    ) -> None:
        """``QuantLinear``'s weight into ``out [n, k]`` (fp32 or bf16), rounded as its torch ops round:
        int4 when ``low`` is given (codes two a byte per group of 32), else int8 rows."""
        n, k = out.shape
        assert codes.is_contiguous() and scale.is_contiguous() and out.is_contiguous()
        if low is None:
            self.fns["dequant_int8", out.dtype](codes.data_ptr(), scale.data_ptr(), n, k, out.data_ptr())
        else:
            assert low.is_contiguous()
            fn = self.fns["dequant_int4", out.dtype]
            fn(codes.data_ptr(), scale.data_ptr(), low.data_ptr(), n, k, out.data_ptr())

    def decode_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         page_table: torch.Tensor, seq_lens_k: torch.Tensor, scale: float,
                         window: int | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """q ``[B, Hq, D]`` (rows may be strided, heads not) over each sequence's keys read from its pages
        in place -> ``[B, Hq, D]``; ``window``: only each sequence's last ``window`` keys; ``sinks``: a
        sink logit per query head."""
        b, nh, d = q.shape
        out = torch.empty_like(q)
        sk = None if sinks is None else sinks.detach().float().contiguous()
        rc = self.fns["decode_attention", q.dtype](q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                                                   page_table.data_ptr(), page_table.stride(0),
                                                   seq_lens_k.data_ptr(), b, nh, k_cache.shape[-2], d,
                                                   k_cache.shape[1], scale, window or 0,
                                                   None if sk is None else sk.data_ptr(), out.data_ptr())  # fmt: skip
        if rc != 0:
            raise ValueError(f"decode_attention: unsupported shape (heads {nh}, head_dim {d})")
        return out

    def paged_decode_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               page_table: torch.Tensor, seq_lens_k: torch.Tensor, scale: float,
                               *, plan: object = None, window: int | None = None,
                               sinks: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """The backend's ``decode_attention`` signature (``plan`` unused: pages are read in place)."""
        return self.decode_attention(q.contiguous(), k_cache, v_cache, page_table.contiguous(),
                                     seq_lens_k.contiguous(), scale, window, sinks)  # fmt: skip

    def extend_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         page_table: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens_k: torch.Tensor,
                         scale: float, *, window: int | None = None,
                         sinks: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """The backend's ``extend_attention``: fp32 and bf16 through the flash kernels (pages read in
        place, sinks too; fp32 also windows), other dtypes, head sizes (``head_dim % 64``) and bf16
        windows through ``kvreuse.kernels.reference``."""
        nh, d = q.shape[1:]
        kernel = self._flash_kernel(q, k_cache, window)
        if kernel is None:
            return reference.extend_attention(
                q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_k, scale, window=window, sinks=sinks
            )
        out = q.new_empty(q.shape[0], nh, d)
        table = page_table.to(torch.int32).contiguous()
        cu = cu_seqlens_q.to(torch.int32).contiguous()
        lens = seq_lens_k.to(torch.int32).contiguous()
        nkv = k_cache.shape[-2]
        sk = None if sinks is None else sinks.detach().float().contiguous()
        for b0, b1 in _scratch_groups(lens.tolist(), nkv * d * 2 * q.element_size()):
            q0, q1 = int(cu[b0]), int(cu[b1])
            sub_cu = (cu[b0 : b1 + 1] - q0).contiguous()
            rc = kernel(q[q0:q1].data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                        table[b0:b1].data_ptr(), table.stride(0), sub_cu.data_ptr(), lens[b0:b1].data_ptr(),
                        b1 - b0, nh, nkv, d, k_cache.shape[1], scale, None if sk is None else sk.data_ptr(),
                        out[q0:q1].data_ptr())  # fmt: skip
            if rc == -2:
                raise MemoryError("extend_attention: out of memory")
            if rc != 0:
                raise ValueError(f"extend_attention: unsupported shape (heads {nh}, head_dim {d})")
        return out

    def _flash_kernel(self, q: torch.Tensor, k_cache: torch.Tensor, window: int | None) -> Callable | None:
        """The flash kernel for these inputs, called with the bf16 kernel's arguments, or ``None``."""
        d = q.shape[2]
        if q.dtype != k_cache.dtype or d % 64 or d > 256 or q.stride(2) != 1 or q.stride(1) != d:
            return None
        if q.dtype == torch.float32:
            fn = self.extend_f32
            return lambda *a: fn(*a[:14], window or 0, *a[14:])  # the window goes before the sinks
        if q.dtype == torch.bfloat16 and window is None:
            return self.extend_bf16
        return None


# The flash kernels pack the keys and values of every sequence they are given (two copies of each
# key's K and V: 4 bytes a key, KV head and dim in bf16, 8 in fp32); a step's sequences go to it in groups of at most this much scratch, so many
# long cached contexts in one step never ask for gigabytes at once.
SCRATCH_BYTES = 256 << 20


def _scratch_groups(lens: list[int], bytes_per_key: int) -> list[tuple[int, int]]:
    """Consecutive runs ``[b0, b1)`` of sequences whose packed keys fit ``SCRATCH_BYTES`` (one at least)."""
    groups, b0, used = [], 0, 0
    for b, lk in enumerate(lens):
        need = (lk + 63) // 64 * 64 * bytes_per_key
        if b > b0 and used + need > SCRATCH_BYTES:
            groups.append((b0, b))
            b0, used = b, 0
        used += need
    groups.append((b0, len(lens)))
    return groups


def load() -> NativeOps | None:
    """The kernels for this machine, or ``None`` (no C compiler, a failed build, ``KVREUSE_NATIVE=0``)."""
    libs = [compile_library(src) for src in SOURCES]
    return None if any(lib is None for lib in libs) else NativeOps(libs)
