"""Few-token MoE experts on CPU: each (token, expert) pair as ``F.embedding_bag`` over the expert's rows.

With an expert's matrix laid out ``[in, out]`` row-major (``Experts.pack_for_cpu``), ``x @ W_e`` is
the sum over ``i`` of ``x[i] * W_e[i, :]``: a weighted bag of the rows ``e * in + i`` of the stacked
``[E * in, out]`` table.  One ``embedding_bag`` call computes that for all ``T * K`` pairs, parallel over
the pairs, reading only the picked experts' rows (contiguous, in order) and nothing else; no sort, no
index/scatter.  The down projection folds the routing weight into its per-row weights, so a token's
output is the sum of its K bags.  Each bag is computed on its own, so a token's result does not depend
on the other rows of the batch (batched == alone exactly, on this path).

Why (2-core AMD EPYC host, fp32, 2 threads, 16 layers cycled so weights come from memory; per MoE
block, ``benchmarks/kernels/moe_decode.py`` shapes): one token, ``tiny-experts`` (32 experts of width 128, top-8,
hidden 512; the dense MLP with the same active parameters: 430 us):

=====================================================  ===========
experts of one token                                   us / layer
=====================================================  ===========
Python loop of ``F.linear`` per expert, transposed       920-1095
  same, gate_up ``[out, in]`` + down transposed           790-950
  same, oneDNN-packed per expert                          905-1020
``F.grouped_mm`` (sorted, offsets)                       1080-1290
gather the K experts' weights + ``bmm``                   990-1360
``torch.compile``d gather-reduce (8 s compile)            320-440
``embedding_bag`` (this module)                           340-440
=====================================================  ===========

``wide-experts`` (16 of width 512, top-4, hidden 1024): loop 1656 -> 1378 us.  For T tokens (random
distinct experts per token), grouped GEMMs -> this, us per block: tiny T = 2 / 3 / 4 / 8: 1798 -> 720,
2364 -> 844, 2791 -> 1027, 3781 -> 1887; wide: 3465 -> 2999, 5131 -> 4115, 5446 -> 5141, 9614 -> 10501.
Whole engine decode (the benchmark's models, tok/s), grouped GEMMs for every batch -> this path up
to 4 rows: tiny 1 / 2 / 4 streams 122 -> 180, 157 -> 277, 236 -> 400; wide 70 -> 74-80, 96 -> 111,
122 -> 123-130.  This path reads an expert once per pair (a later pair's reads of a shared expert hit
the cache at best), the grouped GEMM once per step for all its rows; so ``Experts`` takes it up to
``GATHER_MAX_TOKENS`` rows (decode of a few streams) and keeps the grouped GEMM, one matmul per
active expert, for larger batches and prefill (8 streams through this path measured 330 -> 615 tok/s
on tiny, where an expert's rows stay in L2 between its pairs, and no gain on wide: 157 -> 156).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

# an expert's activation: ``[rows, 2I]`` (gate | up) -> ``[rows, I]``
Glu = Callable[[torch.Tensor], torch.Tensor]


def swiglu(gu: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` (Qwen's experts)."""
    gate, up = gu.chunk(2, dim=-1)
    return F.silu(gate) * up


def gathered_swiglu(
    x: torch.Tensor,
    top_i: torch.Tensor,
    top_w: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    glu: Glu = swiglu,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x [T, H]`` -> ``[T, H]``: each token's ``top_w``-weighted SwiGLU over its ``top_i`` experts.

    ``gate_up [E, H, 2I]`` and ``down [E, I, H]`` contiguous (the ``[in, out]`` layout per expert);
    ``glu``: the activation; the biases ``[E, 2I]`` / ``[E, H]`` (gpt-oss) are added per pair.
    """
    (t, k), (inter, hidden) = top_i.shape, down.shape[1:]
    rows = top_i.reshape(-1, 1)
    gu = F.embedding_bag(
        rows * hidden + torch.arange(hidden, device=x.device),
        gate_up.view(-1, 2 * inter),
        mode="sum",
        per_sample_weights=x.repeat_interleave(k, dim=0),
    )
    if gate_up_bias is not None:
        gu = gu + gate_up_bias.index_select(0, top_i.reshape(-1))
    w = top_w.reshape(-1, 1)
    h = glu(gu) * w
    y = F.embedding_bag(
        rows * inter + torch.arange(inter, device=x.device),
        down.view(-1, hidden),
        mode="sum",
        per_sample_weights=h,
    )
    if down_bias is not None:
        y = y + down_bias.index_select(0, top_i.reshape(-1)) * w
    return y.view(t, k, hidden).sum(1)
