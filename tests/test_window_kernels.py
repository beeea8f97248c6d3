"""Sliding-window attention in every backend against a plain band-masked oracle.

Keys before each sequence's first visible key are NaN in the pool (``tests/paged_pool.py``), so a kernel that reads outside
the window (a window layer's ring reuses those pages) fails, and so does one that ignores the window.
Triton runs in its interpreter without CUDA.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first `import triton`

from kvreuse.kernels import reference  # noqa: E402
from kvreuse.kernels.native_cpu import load  # noqa: E402
from tests.paged_pool import poisoned_pool  # noqa: E402

HKV, GROUP, D, PS = 2, 3, 16, 4


def _oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int, window: int, scale: float):
    """q [Lq, Hq, D] at positions first.., k/v [Lk, Hkv, D]: each query over keys (p - window, p]."""
    out = torch.empty_like(q)
    for j in range(q.shape[0]):
        p = first + j
        lo = max(0, p - window + 1)
        kk = k[lo : p + 1].repeat_interleave(GROUP, dim=1)  # [n, Hq, D]
        vv = v[lo : p + 1].repeat_interleave(GROUP, dim=1)
        w = torch.softmax(torch.einsum("hd,nhd->hn", q[j], kk) * scale, dim=-1)
        out[j] = torch.einsum("hn,nhd->hd", w, vv)
    return out


@pytest.mark.parametrize("window", [1, 5, 8, 13])
def test_extend_window_reference_and_triton(window):
    gen = torch.Generator().manual_seed(window)
    seq_lens, q_lens = [30, 9, 17, 40], [30, 3, 17, 11]
    kc, vc, table, dense = poisoned_pool(seq_lens, q_lens, window, HKV, D, PS, gen)
    first = [n - lq for n, lq in zip(seq_lens, q_lens)]
    q = torch.randn(sum(q_lens), HKV * GROUP, D, generator=gen)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    expected = torch.cat(
        [_oracle(q[cu[i] : cu[i + 1]], *dense[i], first[i], window, 0.3) for i in range(len(seq_lens))]
    )
    got = reference.extend_attention(q, kc, vc, table, cu, lens, 0.3, window=window)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    pytest.importorskip("triton")
    from kvreuse.kernels import triton_attention as ta

    got = ta.extend_attention(q, kc, vc, table, cu, lens, 0.3, window=window)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("window", [1, 6, 8, 600])
def test_decode_window_every_backend(window):
    gen = torch.Generator().manual_seed(window)
    seq_lens = [1, 7, 30, 23]
    kc, vc, table, dense = poisoned_pool(seq_lens, [1] * len(seq_lens), window, HKV, D, PS, gen)
    first = [n - 1 for n in seq_lens]
    q = torch.randn(len(seq_lens), HKV * GROUP, D, generator=gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    expected = torch.cat(
        [_oracle(q[i : i + 1], *dense[i], first[i], window, 0.3) for i in range(len(seq_lens))]
    )
    plan = reference.decode_plan(table, lens, PS, window)
    got = reference.decode_attention(q, kc, vc, table, lens, 0.3, plan=plan, window=window)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    ops = load()
    if ops is not None:  # the C decode kernel (no compiler: the reference above is what runs)
        got = ops.paged_decode_attention(q, kc, vc, table, lens, 0.3, window=window)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    pytest.importorskip("triton")
    from kvreuse.kernels import triton_attention as ta

    got = ta.decode_attention(q, kc, vc, table, lens, 0.3, window=window, num_kv_splits=3)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
