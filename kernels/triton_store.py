"""Triton kernel that scatters new keys/values into their page slots.

Same contract as ``kvreuse.kernels.reference.store_kv``; see that module for the cache layout.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    K,
    V,
    K_CACHE,
    V_CACHE,
    SLOTS,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ckp,
    stride_cks,
    stride_ckh,
    stride_cvp,
    stride_cvs,
    stride_cvh,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(SLOTS + t).to(tl.int64)
    # Negative slots mark padding rows (e.g. a fixed-size CUDA-graph batch): nothing is written.
    if slot < 0:
        return
    offs = tl.arange(0, BLOCK)
    head = offs // HEAD_DIM
    dim = offs % HEAD_DIM
    mask = offs < NUM_KV_HEADS * HEAD_DIM
    page = slot // PAGE_SIZE
    in_page = slot % PAGE_SIZE
    k = tl.load(K + t * stride_kt + head * stride_kh + dim, mask=mask)
    v = tl.load(V + t * stride_vt + head * stride_vh + dim, mask=mask)
    k_dst = K_CACHE + page * stride_ckp + in_page * stride_cks + head * stride_ckh + dim
    v_dst = V_CACHE + page * stride_cvp + in_page * stride_cvs + head * stride_cvh + dim
    tl.store(k_dst, k.to(K_CACHE.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(V_CACHE.dtype.element_ty), mask=mask)


def store_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Write new keys/values ``[T, kv_heads, head_dim]`` into flat slots ``slot_mapping`` ``[T]``.

    Unlike the reference, a negative slot is skipped instead of raising, so padded batches need no
    host-side filtering.  ``k``/``v`` may be strided views (e.g. slices of a fused QKV projection)
    as long as their last dimension is contiguous.
    """
    num_tokens = k.shape[0]
    page_size, num_kv_heads, head_dim = k_cache.shape[1:]
    if k.shape != (num_tokens, num_kv_heads, head_dim) or v.shape != k.shape:
        raise ValueError(
            f"k/v must be [T, {num_kv_heads}, {head_dim}], got {tuple(k.shape)}/{tuple(v.shape)}"
        )
    if slot_mapping.shape != (num_tokens,):
        raise ValueError(f"slot_mapping must be [{num_tokens}], got {tuple(slot_mapping.shape)}")
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last (head_dim) dimension")
    if num_tokens == 0:
        return
    block = triton.next_power_of_2(num_kv_heads * head_dim)
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        PAGE_SIZE=page_size,
        BLOCK=block,
        num_warps=4 if block <= 1024 else 8,
    )
