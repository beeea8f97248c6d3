"""The Triton grouped GEMM for MoE experts against per-expert torch matmuls and our CPU expert path.

Without CUDA the kernel runs in Triton's interpreter (on CPU tensors), so shapes stay small; the
shapes are chosen off the tile sizes (N, K not multiples of 64 / 32, experts with no rows, one
expert with more rows than a tile) so masking and the block table are exercised.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Must precede the first `import triton`: kernels are bound to the interpreter at decoration.
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from kvreuse.kernels.triton_moe import expert_blocks, grouped_gemm, grouped_swiglu  # noqa: E402
from kvreuse.runtime.models.moe import Experts, expert_counts, group_by_expert, route  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def _counts(rows: int, experts: int, gen: torch.Generator) -> torch.Tensor:
    """A random split of ``rows`` over ``experts``, with expert 1 always empty (tests poison its weight)."""
    ids = torch.randint(0, experts, (rows,), generator=gen)
    ids[ids == 1] = 0
    return torch.bincount(ids, minlength=experts)


@pytest.mark.parametrize("rows", [1, 5, 37, 300])
def test_expert_blocks_cover_every_row_once(rows):
    gen = torch.Generator().manual_seed(rows)
    counts = _counts(rows, 6, gen)
    blocks = expert_blocks(counts, rows)
    starts = torch.cumsum(counts, 0) - counts
    covered = torch.zeros(rows, dtype=torch.int64)
    for e, r0, r1 in zip(blocks.expert.tolist(), blocks.row_start.tolist(), blocks.row_end.tolist()):
        if e < 0:
            continue
        assert r1 - r0 <= blocks.block_m and starts[e] <= r0 < r1 <= starts[e] + counts[e]
        covered[r0:r1] += 1
    assert covered.eq(1).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 37, 300])
def test_grouped_gemm_matches_per_expert_matmuls(rows, dtype):
    gen = torch.Generator().manual_seed(7 + rows)
    experts, n, k = 6, 40, 48
    counts = _counts(rows, experts, gen)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    w = torch.randn(experts, n, k, generator=gen).to(dtype)
    ref = torch.cat([x[s : s + c].float() @ w[e].float().T for e, (s, c) in enumerate(_spans(counts))])
    w[1] = float("nan")  # expert 1 has no rows: a read of its weight would poison some output
    out = grouped_gemm(x.to(DEVICE), w.to(DEVICE), expert_blocks(counts.to(DEVICE), rows)).cpu()
    assert out.dtype == dtype and out.shape == (rows, n)
    assert torch.allclose(out.float(), ref, atol=TOL[dtype] * k**0.5, rtol=TOL[dtype])


@pytest.mark.parametrize("tokens", [1, 8, 45])
def test_grouped_swiglu_matches_the_cpu_expert_path(tokens):
    """Routing of random hidden states, then Triton's two grouped GEMMs == ``Experts`` on CPU (fp32)."""
    gen = torch.Generator().manual_seed(tokens)
    experts, hidden, inter, top_k = 8, 64, 40, 2
    mod = Experts(experts, hidden, inter)
    with torch.no_grad():
        mod.gate_up_proj.copy_(torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.1)
        mod.down_proj.copy_(torch.randn(experts, hidden, inter, generator=gen) * 0.1)
    x = torch.randn(tokens, hidden, generator=gen)
    top_w, top_i = route(torch.randn(tokens, experts, generator=gen) * 3, top_k, normalise=True)
    g = group_by_expert(top_i, top_w)
    xs = x.index_select(0, g.token)
    dev = [t.to(DEVICE) for t in (xs, mod.gate_up_proj.detach(), mod.down_proj.detach())]
    ys = grouped_swiglu(*dev, expert_counts(g.expert.to(DEVICE), experts)).cpu()
    got = torch.zeros_like(x).index_add_(0, g.token, ys * g.weight.unsqueeze(1))
    with torch.no_grad():
        ref = mod.forward(x, top_i, top_w)  # the CPU path (one token: its no-sort shortcut)
    assert (got - ref).abs().max().item() < 1e-4


def _spans(counts: torch.Tensor) -> list[tuple[int, int]]:
    starts = (torch.cumsum(counts, 0) - counts).tolist()
    return list(zip(starts, counts.tolist()))
