"""Triton extend (prefill-with-cached-prefix) attention over the paged KV pool.

Same contract as ``kvreuse.kernels.reference.extend_attention``.  One program handles ``BLOCK_M`` new tokens
of one sequence for one query head and streams that sequence's keys (cached prefix, then the new
tokens, all already stored in the pool) ``BLOCK_N`` at a time through the page table, with an online
softmax in fp32.  Each key's slot is ``page_table[seq, pos // page_size] * page_size + pos % page_size``,
so a key block may span several pages and page sizes need not divide ``BLOCK_N``.

Also holds what the decode kernels share with it: the checks, the dot settings, and the paged K/V
block load + online-softmax step (``paged_attend_block``).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreting() -> bool:
    """Whether Triton runs kernels in its numpy interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def check_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Fail early, with a readable message, on layouts the kernels cannot handle."""
    hq, head_dim = q.shape[-2:]
    hkv, cache_dim = k_cache.shape[-2:]
    if q.dtype not in _DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    if head_dim != cache_dim or v_cache.shape != k_cache.shape:
        raise ValueError(f"q head_dim {head_dim} does not match cache shapes {tuple(k_cache.shape)}")
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(
            f"Triton attention needs a power-of-two head_dim >= 16 (e.g. 64, 128), got {head_dim}"
        )
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of kv heads ({hkv})")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last (head_dim) dimension")


def output_buffer(out: torch.Tensor | None, shape: tuple[int, ...], q: torch.Tensor) -> torch.Tensor:
    """``out`` checked against the result's shape and dtype, or a fresh tensor.

    A caller-owned buffer lets a CUDA graph keep a static output address.
    """
    if out is None:
        return torch.empty(shape, dtype=q.dtype, device=q.device)
    if tuple(out.shape) != shape or out.dtype != q.dtype or out.device != q.device or out.stride(-1) != 1:
        raise ValueError(f"out must be {shape} {q.dtype} on {q.device} with a contiguous last dim")
    return out


def dot_settings(dtype: torch.dtype) -> tuple[bool, str | None]:
    """(upcast operands to fp32 before ``tl.dot``, ``input_precision``) for this input dtype.

    fp32 inputs get exact ``ieee`` products rather than tf32; 16-bit inputs keep the backend's
    default.  The interpreter multiplies bf16 operands as their raw uint16 bits, so there they are
    upcast to fp32; compiled GPU code keeps bf16 tensor-core products.
    """
    upcast = dtype == torch.bfloat16 and interpreting()
    return upcast, "ieee" if dtype == torch.float32 or upcast else None


@triton.jit
def paged_attend_block(
    q,
    m_i,
    l_i,
    acc,
    K_CACHE,
    V_CACHE,
    PAGE_ROW,
    kv_head,
    pos,
    key_ok,
    visible,
    offs_d,
    qk_scale,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    PAGE_SIZE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One block of keys at positions ``pos`` of a paged sequence, folded into an online softmax.

    Loads the block's K/V through the sequence's page-table row ``PAGE_ROW`` (slot = page * page_size +
    pos % page_size), scores it against ``q`` rows (log2 units: ``qk_scale`` includes log2(e)), masks
    with ``visible`` and returns the updated running max ``m_i``, sum ``l_i`` and output ``acc``.  Shared
    by the extend and decode kernels.  A row with no visible key yet (a sliding window's band starts
    in a later block) keeps ``m_i = -inf`` and zero sums.
    """
    page = tl.load(PAGE_ROW + pos // PAGE_SIZE, mask=key_ok, other=0).to(tl.int64)
    in_page = pos % PAGE_SIZE
    k_ptr = K_CACHE + page * stride_kp + in_page * stride_ks + kv_head * stride_kh
    v_ptr = V_CACHE + page * stride_vp + in_page * stride_vs + kv_head * stride_vh
    k = tl.load(k_ptr[:, None] + offs_d[None, :], mask=key_ok[:, None], other=0.0).to(q.dtype)
    v = tl.load(v_ptr[:, None] + offs_d[None, :], mask=key_ok[:, None], other=0.0).to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # a window row may see nothing in an early block: keep its sums at 0 instead of exp(-inf + inf)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _extend_kernel(
    Q,
    K_CACHE,
    V_CACHE,
    OUT,
    PAGE_TABLE,
    CU_SEQLENS_Q,
    SEQ_LENS_K,
    SINKS,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_pt,
    window,
    PAGE_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    m_block = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(CU_SEQLENS_Q + seq)
    q_len = tl.load(CU_SEQLENS_Q + seq + 1) - q_start
    if m_block * BLOCK_M >= q_len:
        return
    seq_len_k = tl.load(SEQ_LENS_K + seq)
    prefix = seq_len_k - q_len  # bottom-right causal: query row j sees keys 0 .. prefix + j
    kv_head = head // GROUP

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < q_len
    rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(
        Q + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :], mask=row_ok[:, None], other=0.0
    )
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # Keys past the last row's causal horizon are never visible to this block.
    k_end = tl.minimum(seq_len_k, prefix + (m_block + 1) * BLOCK_M)
    # A sliding window (window > 0): keys before the first row's band are never visible to this block.
    k_lo = 0
    if window > 0:
        k_lo = tl.maximum(prefix + m_block * BLOCK_M - window + 1, 0)
    for start in range(k_lo // BLOCK_N * BLOCK_N, k_end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        key_ok = (pos < k_end) & (pos >= k_lo)  # never load a key below the band: its page may be reused
        visible = key_ok[None, :] & (pos[None, :] <= prefix + offs_m[:, None])
        if window > 0:
            visible = visible & (pos[None, :] > prefix + offs_m[:, None] - window)
        m_i, l_i, acc = paged_attend_block(
            q, m_i, l_i, acc, K_CACHE, V_CACHE, PAGE_TABLE + seq * stride_pt, kv_head, pos, key_ok, visible,
            offs_d, qk_scale, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
            PAGE_SIZE, PRECISION,
        )  # fmt: skip

    if HAS_SINKS:  # the head's sink logit (log2 units) joins the denominator only: rescale to its max
        sink = tl.load(SINKS + head)
        m_f = tl.maximum(m_i, sink)
        c = tl.exp2(m_i - m_f)
        acc = acc * c[:, None]
        l_i = l_i * c + tl.exp2(sink - m_f)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # padding rows see no key
    o_ptr = OUT + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
    tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=row_ok[:, None])


def extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens_k: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of new tokens over their cached prefix plus themselves (already stored).

    q: [total_q, Hq, D] -> out [total_q, Hq, D] (fp32 accumulation, output in q's dtype), written
    into ``out`` when given.  ``window``: a sliding-window layer's W; ``sinks [Hq]``: a learned logit
    per query head in the softmax's denominator (both as ``kvreuse.kernels.reference``).

    The grid needs the longest query run of the batch.  With one sequence that is ``total_q``
    (a shape, no sync); with several it is read from ``cu_seqlens_q`` on the host, one device sync
    per call, which prefill can afford (decode should use ``decode_attention``).
    """
    check_inputs(q, k_cache, v_cache)
    total_q, hq, head_dim = q.shape
    page_size, hkv = k_cache.shape[1], k_cache.shape[2]
    batch = page_table.shape[0]
    out = output_buffer(out, (total_q, hq, head_dim), q)
    if total_q == 0 or batch == 0:
        return out
    max_q = total_q if batch == 1 else int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    upcast, precision = dot_settings(q.dtype)
    block_m = 64
    block_n = 64 if head_dim <= 64 or q.dtype != torch.float32 else 32
    grid = (triton.cdiv(max_q, block_m), batch, hq)
    _extend_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        page_table,
        cu_seqlens_q,
        seq_lens_k,
        seq_lens_k if sinks is None else (sinks.detach().float() * LOG2E).contiguous(),
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
        page_table.stride(0),
        window or 0,
        PAGE_SIZE=page_size,
        GROUP=hq // hkv,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        UPCAST=upcast,
        PRECISION=precision,
        HAS_SINKS=sinks is not None,
        num_warps=4 if head_dim <= 64 else 8,
        num_stages=2,
    )
    return out


__all__ = [
    "extend_attention",
    "check_inputs",
    "dot_settings",
    "interpreting",
    "output_buffer",
    "paged_attend_block",
]
