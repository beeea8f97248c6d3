"""Triton decode attention over the paged KV pool, split along the sequence (flash-decoding).

Same contract as ``kvreuse.kernels.reference.decode_attention``.  Stage 1: one program per (sequence, kv head,
split) reads its share of the keys once for all query heads of the GQA group and writes a partial
output normalised by its own softmax sum, plus that sum's log (log2 units).  Stage 2 merges the
splits of each (sequence, query head).  The split count depends only on tensor shapes, never on
sequence lengths, so a call makes no host sync and can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvreuse.kernels.triton_extend import LOG2E, check_inputs, dot_settings, output_buffer, paged_attend_block

_BLOCK_N = 64
# A split shorter than this spends more on its partial-result round trip than it saves.
_MIN_SPLIT_LEN = 256


@triton.jit
def _decode_split_kernel(
    Q,
    K_CACHE,
    V_CACHE,
    MID_O,
    MID_LSE,
    PAGE_TABLE,
    SEQ_LENS_K,
    qk_scale,
    split_len,
    stride_qb,
    stride_qh,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_pt,
    stride_mob,
    stride_moh,
    stride_mos,
    stride_lb,
    stride_lh,
    window,
    PAGE_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len_k = tl.load(SEQ_LENS_K + seq)
    k_start = split * split_len
    k_end = tl.minimum(seq_len_k, k_start + split_len)
    if window > 0:  # a sliding-window layer: only the last `window` keys
        k_start = tl.maximum(k_start, seq_len_k - window)

    # The group's query heads form the rows of the dot; BLOCK_H >= 16 pads them for tensor cores.
    offs_h = tl.arange(0, BLOCK_H)
    head_ok = offs_h < GROUP
    heads = kv_head * GROUP + offs_h
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptr = Q + seq * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr, mask=head_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    for start in range(k_start, k_end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        key_ok = pos < k_end
        # The loop only runs over non-empty ranges, so every block holds a valid key: m_i stays finite.
        m_i, l_i, acc = paged_attend_block(
            q, m_i, l_i, acc, K_CACHE, V_CACHE, PAGE_TABLE + seq * stride_pt, kv_head, pos, key_ok,
            key_ok[None, :], offs_d, qk_scale, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs,
            stride_vh, PAGE_SIZE, PRECISION,
        )  # fmt: skip

    # An empty split (past the end of a short sequence) contributes weight 0 and a zero output.
    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    mo_ptr = MID_O + seq * stride_mob + heads[:, None] * stride_moh + split * stride_mos + offs_d[None, :]
    tl.store(mo_ptr, out, mask=head_ok[:, None])
    tl.store(MID_LSE + seq * stride_lb + heads * stride_lh + split, lse, mask=head_ok)


@triton.jit
def _decode_reduce_kernel(
    MID_O,
    MID_LSE,
    OUT,
    SINKS,
    num_splits,
    stride_mob,
    stride_moh,
    stride_mos,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    split_ok = offs_s < num_splits
    lse = tl.load(MID_LSE + seq * stride_lb + head * stride_lh + offs_s, mask=split_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    if HAS_SINKS:  # the head's sink logit (log2 units) joins the max and the denominator, no value
        sink = tl.load(SINKS + head)
        m = tl.maximum(m, sink)
    m = tl.where(m == float("-inf"), 0.0, m)  # no keys at all: every weight is 0, output 0
    w = tl.exp2(lse - m)
    mo_ptr = MID_O + seq * stride_mob + head * stride_moh + offs_s[:, None] * stride_mos + offs_d[None, :]
    part = tl.load(mo_ptr, mask=split_ok[:, None], other=0.0)
    total = tl.sum(w, 0)
    if HAS_SINKS:
        total += tl.exp2(sink - m)
    out = tl.sum(w[:, None] * part, 0) / tl.where(total > 0, total, 1.0)
    tl.store(OUT + seq * stride_ob + head * stride_oh + offs_d, out.to(OUT.dtype.element_ty))


def _num_splits(q: torch.Tensor, max_kv: int, batch: int, hkv: int) -> int:
    """Enough programs to fill the device (about 4 per SM), without splits shorter than _MIN_SPLIT_LEN."""
    if q.device.type == "cuda":
        target = 4 * torch.cuda.get_device_properties(q.device).multi_processor_count
    else:
        target = 8
    wanted = triton.cdiv(target, max(batch * hkv, 1))
    return max(1, min(wanted, triton.cdiv(max_kv, _MIN_SPLIT_LEN)))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens_k: torch.Tensor,
    scale: float,
    *,
    num_kv_splits: int | None = None,
    out: torch.Tensor | None = None,
    plan: object | None = None,  # the torch reference's host-side gather plan; unused here
    window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One new token per sequence: q [B, Hq, D] -> [B, Hq, D].

    Splits are sized from the page table's width (its longest possible sequence), so a table much
    wider than the live sequences leaves some splits empty; they exit after writing a zero partial.
    ``num_kv_splits`` overrides the heuristic (tests use it to exercise the merge on short inputs);
    ``out`` is an optional caller-owned result buffer; ``sinks [Hq]``: a learned logit per query head in
    the softmax's denominator (gpt-oss, ``kvreuse.kernels.reference``), merged with the splits.
    A sequence with no keys gets a zero output.
    """
    check_inputs(q, k_cache, v_cache)
    batch, hq, head_dim = q.shape
    page_size, hkv = k_cache.shape[1], k_cache.shape[2]
    out = output_buffer(out, (batch, hq, head_dim), q)
    max_kv = page_table.shape[1] * page_size
    if batch == 0:
        return out
    splits = num_kv_splits if num_kv_splits is not None else _num_splits(q, max_kv, batch, hkv)
    split_len = triton.cdiv(triton.cdiv(max(max_kv, 1), splits), _BLOCK_N) * _BLOCK_N
    splits = triton.cdiv(max(max_kv, 1), split_len)
    mid_o = torch.empty((batch, hq, splits, head_dim), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((batch, hq, splits), dtype=torch.float32, device=q.device)
    upcast, precision = dot_settings(q.dtype)
    group = hq // hkv
    _decode_split_kernel[(batch, hkv, splits)](
        q,
        k_cache,
        v_cache,
        mid_o,
        mid_lse,
        page_table,
        seq_lens_k,
        scale * LOG2E,
        split_len,
        q.stride(0),
        q.stride(1),
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
        page_table.stride(0),
        *mid_o.stride()[:3],
        *mid_lse.stride()[:2],
        window or 0,
        PAGE_SIZE=page_size,
        GROUP=group,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_N=_BLOCK_N,
        UPCAST=upcast,
        PRECISION=precision,
        num_warps=4,
        num_stages=2,
    )
    _decode_reduce_kernel[(batch, hq)](
        mid_o,
        mid_lse,
        out,
        mid_lse if sinks is None else (sinks.detach().float() * LOG2E).contiguous(),
        splits,
        *mid_o.stride()[:3],
        *mid_lse.stride()[:2],
        out.stride(0),
        out.stride(1),
        HEAD_DIM=head_dim,
        BLOCK_S=triton.next_power_of_2(splits),
        HAS_SINKS=sinks is not None,
        num_warps=4,
    )
    return out
