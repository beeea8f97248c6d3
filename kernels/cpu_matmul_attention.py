"""bf16 extend attention on CPU from library GEMMs (oneDNN's avx512_bf16 kernels): the ``reference``
backend's bf16 path (the ``cpu`` backend's is the flash kernel ``kernels/cpu/extend_attention.c``,
~1.4x this rate: it keeps the scores in L1 and does the softmax between the two products).

Without AMX, CPU flash attention gains nothing in bf16 (its small per-block GEMMs run no faster
than fp32), while a bf16 ``mm`` runs at about twice the fp32 rate.  So for bf16 the new tokens'
attention is, per block of query rows: ``q k^T`` (bf16 GEMM, fp32 accumulation, the scores rounded
to bf16 as transformers' eager attention rounds them), a row softmax computed in fp32, and ``p v``.
The prefix needs no mask; the chunk's own keys are hidden on their ``q_len x q_len`` corner only, so
one softmax covers prefix and chunk and no log-sum-exp merge is needed.  A block stops at its last
position's key, so the waste is a triangle per block.  The softmax is ``kvreuse.kernels.cpu_softmax`` (a
small C kernel, causal limit from the row index) where it builds, else ``-inf`` fill + torch.

Layout: the query heads of one KV group are folded into the row axis, ordered (position, head) so
a block of rows is a run of positions: GQA reads each KV head once, with no repeated copy.
"""

from __future__ import annotations

import torch

from kvreuse.kernels import cpu_softmax

# Rows (positions x group heads) per block, and at most this many scores per block (2 MiB of bf16):
# a block's scores stay in cache between the GEMMs and the softmax (best of 192-768 rows and
# 0.5-2 Mi scores at 2 threads, 2 MiB L2 per core, P = 1.9-5.5K).
BLOCK_ROWS = 384
BLOCK_SCORES = 1 << 20


def matmul_extend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Lq, Hq, D], k/v [Hkv, Lk, D] contiguous (the new tokens are the last Lq keys) -> [Lq, Hq, D].

    Bottom-right causal: query i sees keys 0 .. Lk - Lq + i.
    """
    lq, hq, d = q.shape
    hkv, lk, _ = k.shape
    g = hq // hkv
    prefix = lk - lq
    # [Hkv, Lq, G, D] in one pass with the scale folded in (exact for a power of two, 1/8 at D = 64)
    qg = torch.empty(hkv, lq, g, d, dtype=q.dtype, device=q.device)
    torch.mul(q.view(lq, hkv, g, d).permute(1, 0, 2, 3), scale, out=qg)
    qg = qg.view(hkv, lq * g, d)
    fast = cpu_softmax.load() if q.device.type == "cpu" else None
    if fast is None:
        hidden = torch.ones(lq, lq, dtype=torch.bool, device=q.device).triu_(1)  # chunk key j > query i
        hidden = hidden.repeat_interleave(g, dim=0)  # one row per folded row
    out = torch.empty(hkv, lq * g, d, dtype=q.dtype, device=q.device)
    rows = max(g, min(BLOCK_ROWS, BLOCK_SCORES // lk) // g * g)
    for h in range(hkv):
        kt, vh = k[h].t(), v[h]
        for r0 in range(0, lq * g, rows):
            r1 = min(r0 + rows, lq * g)
            end = prefix + (r1 - 1) // g + 1  # later keys are hidden from every row of the block
            s = torch.mm(qg[h, r0:r1], kt[:, :end])
            if fast is None:
                s[:, prefix:].masked_fill_(hidden[r0:r1, : end - prefix], float("-inf"))
                torch.mm(torch.softmax(s, dim=-1), vh[:end], out=out[h, r0:r1])
            else:  # unnormalised exp in place, the causal limit from the row index; divide after p v
                sums = cpu_softmax.softmax_rows_(fast, s, prefix, r0, g)
                torch.mm(s, vh[:end], out=out[h, r0:r1]).div_(sums)
    return out.view(hkv, lq, g, d).permute(1, 0, 2, 3).reshape(lq, hq, d)
