"""Attention with learned sinks (gpt-oss) over the paged KV pool, in torch (any device).

A sink is one extra logit per query head in the softmax's denominator, with no value behind it::

    p_i = exp(s_i - m) / (sum_j exp(s_j - m) + exp(sink - m)),    m = max(max_j s_j, sink)
    out = sum_i p_i v_i

so a head may put weight "nowhere" (transformers' ``eager_attention_forward`` of gpt-oss concatenates
the sink column, softmaxes and drops it: the same sums).  Scores, the max, the exponentials and the
denominator are fp32 whatever the model dtype.

Every attention backend reaches a sink model's layers through here (the ``cpu`` backend's C decode and
flash kernels and the Triton kernels take no sinks): the keys are gathered as ``kernels/reference.py``
gathers them (the same page tables, a window layer's band, its ring), the products are two matmuls per
block of queries, blocks sized so the scores stay within ``_SCORE_ELEMS`` floats.
"""

from __future__ import annotations

import torch

from kernels.reference import DecodePlan, decode_plan, kv_slots

# the largest [heads, queries, keys] fp32 score block one matmul fills (64 MiB)
_SCORE_ELEMS = 1 << 24


def _softmax_sink(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """``scores [..., H, rows, keys]`` fp32 (masked keys at -inf), ``sinks [H]`` -> probabilities."""
    sink = sinks.float().view(-1, 1, 1)
    m = torch.maximum(scores.amax(-1, keepdim=True), sink)
    p = torch.exp(scores - m)
    return p / (p.sum(-1, keepdim=True) + torch.exp(sink - m))


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    sinks: torch.Tensor,
    offset: int,
    window: int | None,
) -> torch.Tensor:
    """q [Lq, Hq, D] over k/v [Hkv, Lk, D]: query j sees keys ``i <= offset + j`` (and ``i > offset + j -
    window`` in a window layer)."""
    lq, hq, d = q.shape
    hkv, lk = k.shape[:2]
    group = hq // hkv
    kf, vf = k.float(), v.float()
    out = torch.empty(lq, hq, d, dtype=q.dtype, device=q.device)
    step = max(1, _SCORE_ELEMS // max(1, hq * lk))
    ki = torch.arange(lk, device=q.device)[None, :]
    for a in range(0, lq, step):
        b = min(lq, a + step)
        qb = q[a:b].float().permute(1, 0, 2).reshape(hkv, group * (b - a), d)  # query heads of a group folded
        s = torch.bmm(qb, kf.transpose(1, 2)).mul_(scale).view(hkv, group, b - a, lk)
        qi = torch.arange(a, b, device=q.device)[:, None] + offset
        hidden = ki > qi
        if window is not None:
            hidden |= ki <= qi - window
        s.masked_fill_(hidden, float("-inf"))
        p = _softmax_sink(s.view(hq, b - a, lk), sinks).view(hkv, group * (b - a), lk)
        o = torch.bmm(p, vf).view(hq, b - a, d)
        out[a:b] = o.permute(1, 0, 2).to(q.dtype)
    return out


def extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens_k: torch.Tensor,
    scale: float,
    sinks: torch.Tensor,
    *,
    window: int | None = None,
) -> torch.Tensor:
    """``kernels.reference.extend_attention`` with a sink logit per query head (``sinks [Hq]``)."""
    page_size = k_cache.shape[1]
    hkv, d = k_cache.shape[2:]
    kf, vf = k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d)
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    for i, lk in enumerate(seq_lens_k.tolist()):
        s, e = cu[i], cu[i + 1]
        if e == s:
            continue
        prefix = lk - (e - s)
        lo = 0 if window is None else max(0, prefix - window + 1)
        slots = kv_slots(page_table[i], lk, page_size, lo)
        k = kf.index_select(0, slots).transpose(0, 1)
        v = vf.index_select(0, slots).transpose(0, 1)
        out[s:e] = _attend(q[s:e], k, v, scale, sinks, prefix - lo, window)
    return out


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens_k: torch.Tensor,
    scale: float,
    sinks: torch.Tensor,
    *,
    plan: DecodePlan | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """One new token per sequence, q [B, Hq, D] -> [B, Hq, D]; ``plan``: the reference backend's, made
    for the same ``window`` (made here when the backend has none)."""
    hkv, d = k_cache.shape[2:]
    b, hq, _ = q.shape
    if plan is None:
        plan = decode_plan(page_table, seq_lens_k, k_cache.shape[1], window)
    k = k_cache.view(-1, hkv, d).index_select(0, plan.slots).view(b, -1, hkv, d).float()
    v = v_cache.view(-1, hkv, d).index_select(0, plan.slots).view(b, -1, hkv, d).float()
    qg = q.float().reshape(b, hkv, hq // hkv, d)
    s = torch.matmul(qg, k.permute(0, 2, 3, 1)).mul_(scale)  # [B, Hkv, group, L]
    if plan.valid is not None:
        s.masked_fill_(~plan.valid[:, None, None, :], float("-inf"))
    p = _softmax_sink(s.view(b, hq, 1, -1), sinks).view(b, hkv, hq // hkv, -1)
    return torch.matmul(p, v.transpose(1, 2)).reshape(b, hq, d).to(q.dtype)
