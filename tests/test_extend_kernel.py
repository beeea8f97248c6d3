"""The bf16 flash extend kernel (``kernels/cpu/extend_attention.c``) against the torch reference.

The oracle is ``kvreuse.kernels.reference.extend_attention`` run in fp32 on the same bf16 inputs (the
reference is checked against transformers by the parity tests).  The kernel's only roundings are
the probabilities (bf16, for ``p v``) and the output, so its error must stay at bf16's output
rounding and below that of the bf16 GEMM path it replaces, which also rounds the scores.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from kvreuse.kernels import reference as ref
from kvreuse.kernels.native_cpu import load

HAS_CC = shutil.which("cc") is not None or shutil.which("gcc") is not None
pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the torch path runs instead")


@pytest.fixture(scope="module")
def ops():
    built = load()
    assert built is not None, "a C compiler is present, so the kernels must build"
    if built.extend_bf16 is None:
        pytest.skip("this CPU has no AVX512-BF16: bf16 extends stay on the reference path")
    return built


def _batch(seqs, nh, nkv, d, dtype=torch.bfloat16, page_size=16, seed=0):
    """A varlen extend batch over a pool whose pages are handed out in a random order."""
    g = torch.Generator().manual_seed(seed)
    need = [(p + n + page_size - 1) // page_size for p, n in seqs]
    pool_pages = sum(need) + 3
    k = torch.randn(pool_pages, page_size, nkv, d, generator=g).to(dtype)
    v = torch.randn(pool_pages, page_size, nkv, d, generator=g).to(dtype)
    order = torch.randperm(pool_pages, generator=g).to(torch.int32)
    table = torch.zeros(len(seqs), max(need) + 2, dtype=torch.int32)  # wider than needed, as the runner's
    at = 0
    for i, n_pages in enumerate(need):
        table[i, :n_pages] = order[at : at + n_pages]
        at += n_pages
    lens = torch.tensor([p + n for p, n in seqs], dtype=torch.int32)
    cu = torch.tensor([0] + [sum(n for _, n in seqs[: i + 1]) for i in range(len(seqs))], dtype=torch.int32)
    q = (2 * torch.randn(int(cu[-1]), nh, d, generator=g)).to(dtype)  # peaked softmax rows too
    return q, k, v, table, cu, lens


# prefix / new lengths around the 16-key vectors, the 64-key packing runs and the 256-key softmax
# blocks; a 1-token extend; a cold prompt (prefix 0)
SEQS = [(0, 5), (16, 300), (1000, 37), (3, 1), (255, 2), (0, 257)]


@pytest.mark.parametrize("nh,nkv,d", [(9, 3, 64), (4, 4, 64), (16, 2, 128), (8, 1, 256)])
def test_extend_kernel_matches_the_fp32_reference(ops, nh, nkv, d) -> None:
    q, k, v, table, cu, lens = _batch(SEQS, nh, nkv, d)
    got = ops.extend_attention(q, k, v, table, cu, lens, d**-0.5)
    want = ref.extend_attention(q.float(), k.float(), v.float(), table, cu, lens, d**-0.5)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1e-2)
    gemm = ref.extend_attention(q, k, v, table, cu, lens, d**-0.5)  # the bf16 path it replaces
    assert float((got.float() - want).abs().mean()) <= float((gemm.float() - want).abs().mean())


def test_extend_kernel_reads_strided_query_rows(ops) -> None:
    """q as a view into fused qkv rows (token rows further apart than heads x head_dim)."""
    nh, nkv, d = 9, 3, 64
    q, k, v, table, cu, lens = _batch([(40, 70), (0, 9)], nh, nkv, d, seed=1)
    qkv = torch.cat([q.view(q.shape[0], -1), torch.zeros(q.shape[0], 2 * nkv * d, dtype=q.dtype)], dim=1)
    strided = qkv[:, : nh * d].view(-1, nh, d)
    assert strided.stride(0) == (nh + 2 * nkv) * d
    got = ops.extend_attention(strided, k, v, table, cu, lens, d**-0.5)
    torch.testing.assert_close(got, ops.extend_attention(q.contiguous(), k, v, table, cu, lens, d**-0.5))


@pytest.mark.parametrize("dtype,d", [(torch.float32, 48), (torch.bfloat16, 48)])
def test_other_dtypes_and_head_sizes_take_the_reference_path(ops, dtype, d) -> None:
    q, k, v, table, cu, lens = _batch([(20, 30)], 4, 2, d, dtype=dtype, seed=2)
    got = ops.extend_attention(q, k, v, table, cu, lens, d**-0.5)
    assert torch.equal(got, ref.extend_attention(q, k, v, table, cu, lens, d**-0.5))


def test_bf16_engine_scores_like_the_reference_backend(ops, tmp_path) -> None:
    """A whole bf16 model scoring a prompt in chunks (each chunk an extend over the cached ones): the
    cpu backend's flash kernel ran, and its logprobs track the reference backend's GEMM path."""
    from kvreuse.runtime.engine.engine import Engine
    from tests.helpers import make_tiny_model

    path = make_tiny_model(tmp_path / "m", arch="qwen3", vocab=512, seed=4, head_dim=64)
    ids = [int(x) for x in torch.randint(3, 500, (700,), generator=torch.Generator().manual_seed(0))]
    scores = {}
    for backend in ("reference", "cpu"):
        e = Engine(
            model_dir=str(path), dtype="bfloat16", device="cpu", num_pages=128, attention_backend=backend
        )
        calls = []
        if backend == "cpu":
            fused = e.runner.backend.fused
            real = fused.extend_bf16
            fused.extend_bf16 = lambda *a, calls=calls, real=real: calls.append(1) or real(*a)
        entries = e.prompt_logprobs(ids, top=1, chunk_size=256)
        assert (len(calls) > 0) == (backend == "cpu")  # the kernel really served the extends
        scores[backend] = torch.tensor([entry[1][0] for entry in entries[1:]])
    diff = (scores["cpu"] - scores["reference"]).abs()
    assert len(diff) == len(ids) - 1
    assert float(diff.mean()) < 5e-3 and float(diff.max()) < 0.05


def test_a_step_is_split_into_groups_of_bounded_scratch(ops, monkeypatch) -> None:
    """Many sequences at once: run in groups whose packed keys fit the scratch budget, same output."""
    import kvreuse.kernels.native_cpu as native

    q, k, v, table, cu, lens = _batch(SEQS, 9, 3, 64, seed=3)
    whole = ops.extend_attention(q, k, v, table, cu, lens, 0.125)
    assert len(native._scratch_groups(lens.tolist(), 3 * 64 * 4)) == 1
    monkeypatch.setattr(native, "SCRATCH_BYTES", 300 * 3 * 64 * 4)  # about one 300-key sequence a group
    groups = native._scratch_groups(lens.tolist(), 3 * 64 * 4)
    assert len(groups) >= 4 and groups[0][0] == 0 and groups[-1][1] == len(SEQS)
    assert all(a[1] == b[0] for a, b in zip(groups, groups[1:]))
    assert torch.equal(ops.extend_attention(q, k, v, table, cu, lens, 0.125), whole)
