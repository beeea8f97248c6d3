"""Triton paged-attention kernels against the torch reference.

Without CUDA the kernels run in Triton's interpreter, so shapes stay small.  Every cache built here
poisons what the kernels must not read (slots past each sequence's end, the page that pads the page
table) with NaN, and outputs are pre-filled with NaN, so a stray read or a missed write shows up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

if not torch.cuda.is_available():
    # Must precede the first `import triton`: kernels are bound to the interpreter at decoration.
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from kvreuse.kernels import reference  # noqa: E402
from kvreuse.kernels import triton_attention as ta  # noqa: E402
from kvreuse.kernels.backends import select_backend  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@dataclass
class PagedBatch:
    """A shuffled paged KV pool holding ``seq_lens_k`` tokens per sequence."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    page_table: torch.Tensor
    seq_lens_k: torch.Tensor


def make_paged_batch(
    seq_lens: list[int], page_size: int, hkv: int, head_dim: int, dtype: torch.dtype, gen: torch.Generator
) -> PagedBatch:
    """Pages handed out in a random order; the table is one column wider than needed."""
    pages_per_seq = [(n + page_size - 1) // page_size for n in seq_lens]
    num_pages = sum(pages_per_seq) + 3  # spare pages; the last one is the NaN padding page
    poison_page = num_pages - 1
    shape = (num_pages, page_size, hkv, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    order = torch.randperm(num_pages - 1, generator=gen).tolist()
    width = max(pages_per_seq) + 1
    page_table = torch.full((len(seq_lens), width), poison_page, dtype=torch.int32)
    k_flat, v_flat = k_cache.view(-1, hkv, head_dim), v_cache.view(-1, hkv, head_dim)
    for i, (n, n_pages) in enumerate(zip(seq_lens, pages_per_seq, strict=True)):
        page_table[i, :n_pages] = torch.tensor(order[:n_pages], dtype=torch.int32)
        order = order[n_pages:]
        if n % page_size:
            tail = reference.kv_slots(page_table[i], n_pages * page_size, page_size)[n:]
            k_flat[tail] = float("nan")
            v_flat[tail] = float("nan")
    k_cache[poison_page] = float("nan")
    v_cache[poison_page] = float("nan")
    seq_lens_k = torch.tensor(seq_lens, dtype=torch.int32)
    return PagedBatch(k_cache.to(DEVICE), v_cache.to(DEVICE), page_table.to(DEVICE), seq_lens_k.to(DEVICE))


def assert_close_to_fp32_reference(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert not out.isnan().any(), "kernel left NaN in its output (unwritten element or poisoned read)"
    tol = TOL[dtype]
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_store_kv_writes_exactly_the_given_slots(page_size: int, cache_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(page_size)
    num_pages, hkv, d = 6, 2, 64
    shape = (num_pages, page_size, hkv, d)
    k_cache = torch.full(shape, float("nan"), dtype=cache_dtype, device=DEVICE)
    v_cache = torch.full(shape, float("nan"), dtype=cache_dtype, device=DEVICE)
    n_tokens = 5
    slots = torch.randperm(num_pages * page_size, generator=gen)[:n_tokens]
    # k and v as strided fp32 slices of one fused projection, like a model's qkv output.  Values are
    # representable in the cache dtype: the interpreter rounds fp32->bf16 toward zero, GPUs to nearest.
    fused = torch.randn(n_tokens, 3 * hkv, d, generator=gen).to(cache_dtype).float()
    k, v = fused[:, hkv : 2 * hkv].to(DEVICE), fused[:, 2 * hkv :].to(DEVICE)
    ta.store_kv(k_cache, v_cache, slots.to(torch.int32).to(DEVICE), k, v)

    flat_k, flat_v = k_cache.view(-1, hkv, d).cpu(), v_cache.view(-1, hkv, d).cpu()
    torch.testing.assert_close(flat_k[slots], k.cpu().to(cache_dtype), atol=0, rtol=0)
    torch.testing.assert_close(flat_v[slots], v.cpu().to(cache_dtype), atol=0, rtol=0)
    untouched = torch.ones(num_pages * page_size, dtype=torch.bool)
    untouched[slots] = False
    assert flat_k[untouched].isnan().all() and flat_v[untouched].isnan().all()


def test_store_kv_skips_negative_padding_slots() -> None:
    hkv, d = 2, 64
    k_cache = torch.full((4, 16, hkv, d), float("nan"), device=DEVICE)
    v_cache = torch.full_like(k_cache, float("nan"))
    k = torch.randn(3, hkv, d, device=DEVICE)
    slots = torch.tensor([7, -1, 40], dtype=torch.int32, device=DEVICE)
    ta.store_kv(k_cache, v_cache, slots, k, -k)
    flat = k_cache.view(-1, hkv, d)
    torch.testing.assert_close(flat[[7, 40]], k[[0, 2]], atol=0, rtol=0)
    assert flat.isnan().sum() == (flat.shape[0] - 2) * hkv * d


EXTEND_CASES = {
    # name: (prefix lengths, new-token lengths) per sequence
    "no_prefix": ([0, 0, 0], [9, 1, 17]),
    "misaligned_prefix": ([5, 19, 0], [12, 3, 6]),
    "decode_like_rows": ([19, 5], [1, 1]),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("case", EXTEND_CASES)
def test_extend_matches_reference(case: str, page_size: int, dtype: torch.dtype) -> None:
    prefixes, q_lens = EXTEND_CASES[case]
    hq, hkv, d = 4, 2, 64
    gen = torch.Generator().manual_seed(list(EXTEND_CASES).index(case) * 100 + page_size)
    batch = make_paged_batch(
        [p + n for p, n in zip(prefixes, q_lens, strict=True)], page_size, hkv, d, dtype, gen
    )
    cu = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32).to(DEVICE)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(dtype).to(DEVICE)
    scale = d**-0.5

    out = torch.full_like(q, float("nan"))
    got = ta.extend_attention(
        q, batch.k_cache, batch.v_cache, batch.page_table, cu, batch.seq_lens_k, scale, out=out
    )
    assert got.data_ptr() == out.data_ptr()
    expected = reference.extend_attention(
        q.float(), batch.k_cache.float(), batch.v_cache.float(), batch.page_table, cu, batch.seq_lens_k, scale
    )
    assert_close_to_fp32_reference(got, expected, dtype)


def test_extend_single_sequence_long_prompt_crosses_query_blocks() -> None:
    # 70 new tokens after a 21-token prefix: two query blocks, the causal edge inside a key block.
    hq, hkv, d = 4, 2, 64
    gen = torch.Generator().manual_seed(3)
    batch = make_paged_batch([91], 16, hkv, d, torch.float32, gen)
    q = torch.randn(70, hq, d, generator=gen).to(DEVICE)
    cu = torch.tensor([0, 70], dtype=torch.int32, device=DEVICE)
    args = (batch.k_cache, batch.v_cache, batch.page_table, cu, batch.seq_lens_k, 0.125)
    got = ta.extend_attention(q, *args)
    assert_close_to_fp32_reference(got, reference.extend_attention(q, *args), torch.float32)


DECODE_LENS = [1, 5, 19, 64, 150]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("num_kv_splits", [None, 3])
def test_decode_matches_reference(num_kv_splits: int | None, page_size: int, dtype: torch.dtype) -> None:
    hq, hkv, d = 4, 2, 64
    gen = torch.Generator().manual_seed(page_size + (num_kv_splits or 0))
    batch = make_paged_batch(DECODE_LENS, page_size, hkv, d, dtype, gen)
    q = torch.randn(len(DECODE_LENS), hq, d, generator=gen).to(dtype).to(DEVICE)
    scale = d**-0.5

    out = torch.full_like(q, float("nan"))
    args = (batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens_k, scale)
    got = ta.decode_attention(q, *args, num_kv_splits=num_kv_splits, out=out)
    assert got.data_ptr() == out.data_ptr()
    expected = reference.decode_attention(
        q.float(), *(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    )
    assert_close_to_fp32_reference(got, expected, dtype)


@pytest.mark.parametrize("hq,hkv,d", [(4, 1, 64), (2, 2, 128)])
def test_other_gqa_groups_and_head_dim_128(hq: int, hkv: int, d: int) -> None:
    gen = torch.Generator().manual_seed(hq * hkv + d)
    lens = [23, 40]
    batch = make_paged_batch(lens, 16, hkv, d, torch.float32, gen)
    scale = d**-0.5
    q_dec = torch.randn(2, hq, d, generator=gen).to(DEVICE)
    dec_args = (batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens_k, scale)
    got = ta.decode_attention(q_dec, *dec_args, num_kv_splits=2)
    assert_close_to_fp32_reference(got, reference.decode_attention(q_dec, *dec_args), torch.float32)

    q_ext = torch.randn(11, hq, d, generator=gen).to(DEVICE)
    cu = torch.tensor([0, 4, 11], dtype=torch.int32, device=DEVICE)
    ext_args = (batch.k_cache, batch.v_cache, batch.page_table, cu, batch.seq_lens_k, scale)
    got = ta.extend_attention(q_ext, *ext_args)
    assert_close_to_fp32_reference(got, reference.extend_attention(q_ext, *ext_args), torch.float32)


def test_decode_agrees_with_extend_on_single_new_tokens() -> None:
    gen = torch.Generator().manual_seed(11)
    batch = make_paged_batch([33, 7], 16, 2, 64, torch.bfloat16, gen)
    q = torch.randn(2, 4, 64, generator=gen).to(torch.bfloat16).to(DEVICE)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEVICE)
    dec = ta.decode_attention(q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens_k, 0.125)
    ext = ta.extend_attention(q, batch.k_cache, batch.v_cache, batch.page_table, cu, batch.seq_lens_k, 0.125)
    torch.testing.assert_close(dec.float(), ext.float(), atol=2e-2, rtol=2e-2)


def test_non_power_of_two_head_dim_is_rejected_clearly() -> None:
    q = torch.randn(1, 2, 80)
    cache = torch.randn(2, 16, 2, 80)
    pt = torch.zeros(1, 1, dtype=torch.int32)
    lens = torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="power-of-two head_dim"):
        ta.decode_attention(q, cache, cache, pt, lens, 0.1)


def test_select_backend_returns_the_triton_kernels() -> None:
    backend = select_backend(DEVICE, "triton")
    assert backend.name == "triton"
    assert (backend.store_kv, backend.extend_attention, backend.decode_attention) == (
        ta.store_kv,
        ta.extend_attention,
        ta.decode_attention,
    )
