"""Grouped GEMM for MoE experts in Triton: rows sorted by expert times each row's expert's matrix.

The rows of ``x [M, K]`` are grouped by expert (``counts[e]`` consecutive rows for expert ``e``,
experts in order, as ``kvreuse.runtime.models.moe.group_by_expert`` leaves them); ``w [E, N, K]`` holds every
expert's weight in the ``nn.Linear`` layout.  One program computes a ``BLOCK_M x BLOCK_N`` tile of
one expert's rows, so each active expert's weight tile is read once per ``BLOCK_M`` of its rows and
inactive experts are never read.

The block table (which expert and rows each program covers) is built on the device from ``counts``
with a fixed upper bound on the number of blocks, so nothing waits for the GPU and the launch has
a static shape (what CUDA graph capture needs); programs past the last real block exit at once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kvreuse.kernels.triton_extend import dot_settings


class ExpertBlocks(NamedTuple):
    """Per program: its expert (-1: no work), first row and end row in the grouped rows."""

    expert: torch.Tensor  # [B] int32
    row_start: torch.Tensor  # [B] int32
    row_end: torch.Tensor  # [B] int32
    block_m: int


def expert_blocks(counts: torch.Tensor, num_rows: int) -> ExpertBlocks:
    """Split each expert's rows into ``block_m`` tiles; the table has a static length for ``num_rows``."""
    block_m = 16 if num_rows <= 256 else 64  # decode: few rows per expert, keep tiles small
    e_count = counts.shape[0]
    max_blocks = triton.cdiv(num_rows, block_m) + min(e_count, num_rows)  # >= sum cdiv(count_e, block_m)
    counts = counts.to(torch.int64)
    nblk = (counts + block_m - 1) // block_m
    blk_end = torch.cumsum(nblk, 0)
    starts = torch.cumsum(counts, 0) - counts
    b = torch.arange(max_blocks, device=counts.device)
    e = torch.searchsorted(blk_end, b, right=True)
    valid = e < e_count
    ec = e.clamp(max=e_count - 1)
    row = starts[ec] + (b - (blk_end[ec] - nblk[ec])) * block_m
    end = torch.minimum(starts[ec] + counts[ec], row + block_m)
    return ExpertBlocks(
        torch.where(valid, ec, -1).to(torch.int32),
        row.to(torch.int32),
        torch.where(valid, end, row).to(torch.int32),
        block_m,
    )


@triton.jit
def _grouped_gemm_kernel(
    x_ptr, w_ptr, out_ptr, expert_ptr, row_start_ptr, row_end_ptr,
    N, K, stride_xm, stride_we, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(expert_ptr + pid_m)
    if e < 0:
        return
    row0 = tl.load(row_start_ptr + pid_m)
    row_end = tl.load(row_end_ptr + pid_m)
    rm = row0 + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_mask = rm < row_end
    n_mask = rn < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm
    w_cols = w_ptr + e.to(tl.int64) * stride_we + rn.to(tl.int64)[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        k_mask = k < K
        a = tl.load(x_rows + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(w_cols + k[:, None], mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc += tl.dot(a, b, input_precision=PRECISION)
    out = out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, blocks: ExpertBlocks) -> torch.Tensor:
    """``out[i] = x[i] @ w[expert of row i].T`` for rows grouped by expert: ``[M, K] x [E, N, K] -> [M, N]``."""
    m, k = x.shape
    e, n, k_w = w.shape
    if k != k_w:
        raise ValueError(f"grouped_gemm: x has {k} columns, experts take {k_w}")
    x = x.contiguous()
    w = w if w.stride(2) == 1 else w.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    block_n, block_k = 64, 32
    upcast, precision = dot_settings(x.dtype)
    grid = (blocks.expert.shape[0], triton.cdiv(n, block_n))
    _grouped_gemm_kernel[grid](
        x, w, out, blocks.expert, blocks.row_start, blocks.row_end,
        n, k, x.stride(0), w.stride(0), w.stride(1), out.stride(0),
        BLOCK_M=blocks.block_m, BLOCK_N=block_n, BLOCK_K=block_k, UPCAST=upcast, PRECISION=precision,
    )  # fmt: skip
    return out


def grouped_swiglu(
    xs: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, counts: torch.Tensor
) -> torch.Tensor:
    """Every grouped row through its expert's SwiGLU: ``down(silu(gate) * up)``, two grouped GEMMs."""
    blocks = expert_blocks(counts, xs.shape[0])
    gu = grouped_gemm(xs, gate_up, blocks)
    inter = down.shape[2]
    return grouped_gemm(F.silu(gu[:, :inter]) * gu[:, inter:], down, blocks)
