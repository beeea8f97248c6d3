"""The CPU extend path (prefix without a mask + chunk causally, merged by log-sum-exp, or padded
queries for a short prefix) against plain masked attention in float64."""

from __future__ import annotations

import pytest
import torch

from kvreuse.kernels import cpu_matmul_attention, cpu_softmax, reference


def masked_attention_f64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Textbook softmax(q k^T) v with the bottom-right causal mask; q [Lq, Hq, D], k/v [Lk, Hkv, D]."""
    lq, hq, _ = q.shape
    lk, hkv, _ = k.shape
    group = hq // hkv
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    visible = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq)
    s = s.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)


def paged(seq_lens: list[int], page_size: int, hkv: int, d: int, dtype: torch.dtype, gen: torch.Generator):
    """A pool whose pages are handed out in random order; returns caches, page table, seq_lens."""
    n_pages = [(n + page_size - 1) // page_size for n in seq_lens]
    total = sum(n_pages) + 1
    k_cache = torch.randn(total, page_size, hkv, d, generator=gen).to(dtype)
    v_cache = torch.randn(total, page_size, hkv, d, generator=gen).to(dtype)
    order = torch.randperm(total, generator=gen).tolist()
    table = torch.zeros(len(seq_lens), max(n_pages), dtype=torch.int32)
    for i, n in enumerate(n_pages):
        table[i, :n] = torch.tensor(order[:n], dtype=torch.int32)
        order = order[n:]
    return k_cache, v_cache, table, torch.tensor(seq_lens, dtype=torch.int32)


def run_case(prefixes: list[int], q_lens: list[int], dtype: torch.dtype, hq: int = 6, hkv: int = 2):
    gen = torch.Generator().manual_seed(sum(prefixes) + 7 * sum(q_lens))
    d, page_size, scale = 64, 16, 0.125
    seq_lens = [p + n for p, n in zip(prefixes, q_lens, strict=True)]
    k_cache, v_cache, table, lens = paged(seq_lens, page_size, hkv, d, dtype, gen)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(dtype)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    got = reference.extend_attention(q, k_cache, v_cache, table, cu, lens, scale)
    parts = []
    for i, n in enumerate(seq_lens):
        slots = reference.kv_slots(table[i], n, page_size)
        k = k_cache.view(-1, hkv, d)[slots]
        v = v_cache.view(-1, hkv, d)[slots]
        parts.append(masked_attention_f64(q[cu[i] : cu[i + 1]], k, v, scale))
    return got, torch.cat(parts)


# (prefix, new): the padded path (short prefix), the merged path, a prefix longer than the chunk
CASES = [([3], [40]), ([40], [33]), ([200], [50]), ([1], [2]), ([70, 0, 5], [20, 31, 1])]


@pytest.mark.parametrize(("prefixes", "q_lens"), CASES)
def test_extend_matches_masked_attention_fp32(prefixes: list[int], q_lens: list[int]) -> None:
    got, expected = run_case(prefixes, q_lens, torch.float32)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("prefixes", "q_lens"), CASES[:3])
def test_extend_bf16_close_to_fp64(prefixes: list[int], q_lens: list[int]) -> None:
    got, expected = run_case(prefixes, q_lens, torch.bfloat16)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), expected, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("pad_limit", [0, 10**9])
def test_both_strategies_agree(monkeypatch: pytest.MonkeyPatch, pad_limit: int) -> None:
    """Force each of the two exact methods on the same inputs: both match the oracle."""
    monkeypatch.setattr(reference, "_PAD_LIMIT", pad_limit)
    got, expected = run_case([24, 90], [17, 64], torch.float32, hq=4, hkv=4)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("softmax", ["c", "torch"])
@pytest.mark.parametrize("block_rows", [6, 384])
@pytest.mark.parametrize(("prefixes", "q_lens"), [*CASES, ([0], [37]), ([300], [250])])
def test_bf16_matmul_path_close_to_fp64(
    monkeypatch: pytest.MonkeyPatch, prefixes: list[int], q_lens: list[int], block_rows: int, softmax: str
) -> None:
    """The bf16 GEMM path (forced for every size; small blocks split a chunk's causal corner), with
    the C softmax kernel and with its torch fallback."""
    if softmax == "c" and cpu_softmax.load() is None:
        pytest.skip("the C softmax kernel does not build or this CPU lacks AVX512-BF16")
    if softmax == "torch":
        monkeypatch.setattr(cpu_softmax, "load", lambda: None)
    monkeypatch.setattr(reference, "_MATMUL_MIN_PAIRS", 0)
    monkeypatch.setattr(cpu_matmul_attention, "BLOCK_ROWS", block_rows)
    got, expected = run_case(prefixes, q_lens, torch.bfloat16, hq=6, hkv=2)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), expected, atol=3e-2, rtol=3e-2)


def test_c_softmax_rows_match_torch() -> None:
    """The C kernel row by row: unnormalised exp / row sum == softmax over each row's visible keys."""
    lib = cpu_softmax.load()
    if lib is None:
        pytest.skip("the C softmax kernel does not build or this CPU lacks AVX512-BF16")
    gen = torch.Generator().manual_seed(3)
    prefix, row0, group, rows, cols = 30, 4, 3, 40, 45
    s = (torch.randn(rows, cols + 5, generator=gen) * 4).to(torch.bfloat16)[:, :cols]  # rows strided
    visible = torch.arange(cols)[None, :] < prefix + (row0 + torch.arange(rows)[:, None]) // group + 1
    expected = s.float().masked_fill(~visible, float("-inf")).softmax(-1)
    sums = cpu_softmax.softmax_rows_(lib, s, prefix, row0, group)
    torch.testing.assert_close(s.float() / sums, expected, atol=2e-3, rtol=1e-2)
    assert bool((s[~visible] == 0).all())
