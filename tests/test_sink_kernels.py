"""Learned attention sinks (gpt-oss) in every attention backend, against transformers' own gpt-oss
eager attention (``eager_attention_forward``: the sink column concatenated, softmaxed and dropped).

Backends: the torch reference, the ``cpu`` backend's C kernels (paged decode in fp32 and bf16, the
fp32 flash extend kernel, the bf16 one where the CPU has AVX512-BF16) and the Triton kernels (in the interpreter
without CUDA).  Keys before each sequence's first visible key are NaN in the pool, so a kernel that
reads outside a window fails; some heads get a sink far above their scores and some far below, so a
kernel that drops the sink, or adds it outside the max, fails too.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first `import triton`

from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward  # noqa: E402

from kvreuse.kernels import reference  # noqa: E402
from kvreuse.kernels.native_cpu import load  # noqa: E402
from tests.paged_pool import poisoned_pool  # noqa: E402

HKV, GROUP, PS = 2, 3, 4
HQ = HKV * GROUP
SCALE = 0.3


def _sinks(gen: torch.Generator) -> torch.Tensor:
    s = torch.randn(HQ, generator=gen)
    s[0], s[1] = 12.0, -40.0  # one head mostly "nowhere", one whose sink is negligible
    return s


def _oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int, window: int | None,
            sinks: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """q [Lq, Hq, D] at positions first.., k/v [Lk, Hkv, D] -> [Lq, Hq, D] through transformers."""
    lq, lk = q.shape[0], k.shape[0]
    qi = torch.arange(lq)[:, None] + first
    ki = torch.arange(lk)[None, :]
    seen = ki <= qi
    if window is not None:
        seen &= ki > qi - window
    mask = torch.zeros(lq, lk).masked_fill(~seen, float("-inf"))[None, None]
    module = SimpleNamespace(num_key_value_groups=GROUP, sinks=sinks, training=False)
    out, _ = eager_attention_forward(
        module, q.transpose(0, 1)[None].double(), k.transpose(0, 1)[None].double(),
        v.transpose(0, 1)[None].double(), mask.double(), SCALE,
    )  # fmt: skip
    return out[0].float()


def _expected(q, dense, seq_lens, q_lens, window, sinks):
    outs, row = [], 0
    for (k, v), n, lq in zip(dense, seq_lens, q_lens):
        outs.append(_oracle(q[row : row + lq].float(), k, v, n - lq, window, sinks))
        row += lq
    return torch.cat(outs)


def _extend_kernels():
    impls = [("reference", reference.extend_attention)]
    ops = load()
    if ops is not None:  # the fp32 flash kernel always, the bf16 one where the CPU has AVX512-BF16
        impls.append(("cpu", ops.extend_attention))
    if pytest.importorskip("triton"):
        from kvreuse.kernels import triton_attention

        impls.append(("triton", triton_attention.extend_attention))
    return impls


def _decode_kernels():
    impls = [("reference", reference.decode_attention)]
    ops = load()
    if ops is not None:
        impls.append(("cpu", ops.paged_decode_attention))
    from kvreuse.kernels import triton_attention

    impls.append(("triton", triton_attention.decode_attention))
    return impls


@pytest.mark.parametrize("window", [None, 5, 12])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extend_with_sinks_matches_transformers(window, dtype):
    gen = torch.Generator().manual_seed(7 + (window or 0))
    seq_lens, q_lens = [9, 30, 21], [9, 11, 1]  # a whole prompt, a chunk over a prefix, one token
    for name, fn in _extend_kernels():
        d = 64 if name == "cpu" else 16  # the flash kernel takes head_dim % 64 only
        kc, vc, table, dense = poisoned_pool(seq_lens, q_lens, window, HKV, d, PS, gen)
        q = torch.randn(sum(q_lens), HQ, d, generator=gen)
        sinks = _sinks(gen)
        cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
        lens = torch.tensor(seq_lens, dtype=torch.int32)
        want = _expected(q, dense, seq_lens, q_lens, window, sinks)
        got = fn(q.to(dtype), kc.to(dtype), vc.to(dtype), table, cu, lens, SCALE, window=window, sinks=sinks)
        tol = 1e-5 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol, msg=f"{name} {dtype}")
        # without sinks every head's weights sum to 1: the sink must have changed the output
        plain = fn(q.to(dtype), kc.to(dtype), vc.to(dtype), table, cu, lens, SCALE, window=window)
        assert (plain.float() - want).abs().max() > 0.1, name


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_with_sinks_matches_transformers(window, dtype):
    gen = torch.Generator().manual_seed(11 + (window or 0))
    seq_lens = [1, 13, 700]  # 700 keys: the C kernel's work items split a sequence at 512 keys
    q_lens = [1] * len(seq_lens)
    for name, fn in _decode_kernels():
        d = 16 if name == "triton" else 32
        kc, vc, table, dense = poisoned_pool(seq_lens, q_lens, window, HKV, d, PS, gen)
        q = torch.randn(len(seq_lens), HQ, d, generator=gen)
        sinks = _sinks(gen)
        lens = torch.tensor(seq_lens, dtype=torch.int32)
        want = _expected(q, dense, seq_lens, q_lens, window, sinks)
        kwargs = {"num_kv_splits": 3} if name == "triton" else {}  # the split merge takes the sink
        got = fn(q.to(dtype), kc.to(dtype), vc.to(dtype), table, lens, SCALE, window=window, sinks=sinks,
                 **kwargs)  # fmt: skip
        tol = 1e-5 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol, msg=f"{name} {dtype}")
