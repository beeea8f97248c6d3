"""Pure-torch reference kernels over the paged KV pool.

These run on any device and are the test oracle for the Triton kernels.

Layout shared by every kernel (see ``runtime/runner/kv_pool.py``)::

    k_cache, v_cache : [num_pages, page_size, num_kv_heads, head_dim]
    slot             = page * page_size + offset          (a flat token slot)
    page_table       : [batch, max_pages] int32, row i lists sequence i's pages in order
    seq_lens_k       : [batch] int32, keys of sequence i *including* the new tokens
    cu_seqlens_q     : [batch + 1] int32, new (query) tokens of sequence i are rows
                       cu_seqlens_q[i] : cu_seqlens_q[i+1] of the flat q

The new tokens of a sequence are the *last* q_len of its seq_len_k keys, so the
causal mask is aligned bottom-right: query j (0-based among the new tokens) sees
keys 0 .. seq_len_k - q_len + j.  ``scaled_dot_product_attention(is_causal=True)``
aligns top-left, which is only right when q_len == seq_len_k.

A sliding-window layer (``window=W``) sees only the last W keys of each query, as transformers'
sliding mask: the query at position p sees keys p - W < k <= p.  Keys before the first query's
window are never read, so their pages may hold anything (a window layer's ring reuses them)::

    keys      0 ........ lo ......... prefix ......... seq_len_k
                         [  read: lo = max(0, prefix - W + 1)  ]
    query p              (p - W, p]  (a band: causal and windowed)

Learned **sinks** (gpt-oss, ``sinks=[Hq]``): one extra logit per query head in the softmax's
denominator, with no value behind it, so a head may put weight "nowhere"::

    p_i = exp(s_i - m) / (sum_j exp(s_j - m) + exp(sink - m)),    m = max(max_j s_j, sink)

(transformers' eager gpt-oss attention concatenates the sink column, softmaxes and drops it: the same
sums).  With sinks, scores, the max, the exponentials and the denominator are fp32 whatever the model
dtype, and the products are two matmuls per block of folded query rows (``_SCORE_ELEMS``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from kvreuse.kernels.cpu_matmul_attention import matmul_extend


def store_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Write new keys/values ``[T, kv_heads, head_dim]`` into their slots."""
    num_kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def kv_slots(page_table: torch.Tensor, seq_len: int, page_size: int, lo: int = 0) -> torch.Tensor:
    """Flat slot index of tokens ``lo .. seq_len - 1`` of one sequence."""
    n_pages = (seq_len + page_size - 1) // page_size
    first = lo // page_size
    pages = page_table[first:n_pages].long()
    offs = torch.arange(page_size, device=pages.device)
    return (pages[:, None] * page_size + offs[None, :]).reshape(-1)[
        lo - first * page_size : seq_len - first * page_size
    ]


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """q [1, Hq, Lq, D], k/v [1, Hkv, Lk, D]; ``causal`` is top-left aligned (only right for Lq == Lk)."""
    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)


def _attend_cpu_extend(
    qt: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, scale: float, prefix: int
) -> torch.Tensor:
    """New tokens over ``prefix`` cached keys plus themselves, with mask-free fused kernels only.

    A boolean mask keeps sdpa off its causal path: every query scores every key and reads the mask,
    1.5-2.3x the work of what it can see.  Two exact alternatives instead:

    * a short prefix: prepend ``prefix`` dummy query rows so the top-left causal mask lines up
      with the real rows, and drop them after; the waste is ``prefix**2 / 2`` scores;
    * otherwise: the prefix without a mask and the chunk causally, each returning its row
      log-sum-exp, merged exactly: ``o = o_c + (o_p - o_c) * sigmoid(lse_p - lse_c)``.
    """
    lq = qt.shape[2]
    if prefix * prefix <= _PAD_LIMIT * lq:
        pad = qt.new_zeros(qt.shape[0], qt.shape[1], prefix, qt.shape[3])
        return _sdpa(torch.cat((pad, qt), dim=2), kt, vt, scale, True)[:, :, prefix:]
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    o_p, lse_p = _flash_gqa_folded(qt, kt[:, :, :prefix], vt[:, :, :prefix], scale)
    o_c, lse_c = flash(qt, kt[:, :, prefix:], vt[:, :, prefix:], is_causal=True, scale=scale)
    w = torch.sigmoid(lse_p - lse_c)[..., None]  # share of the softmax mass on the prefix, fp32
    return torch.lerp(o_c.float(), o_p.float(), w).to(qt.dtype)


def _flash_gqa_folded(
    qt: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked flash attention with the query heads of a KV group folded into the query axis.

    Exact (every query row sees the same keys), and CPU flash's own GQA handling is slower: at P=3584
    keys, 512 queries, 9 q / 3 kv heads, 2 threads, 41 -> 29 ms in bf16, 28 -> 26 ms in fp32.
    """
    b, hq, lq, d = qt.shape
    hkv = kt.shape[1]
    qg = qt.reshape(b, hkv, (hq // hkv) * lq, d)  # query head h reads kv head h // group
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qg, kt, vt, scale=scale)
    return o.reshape(b, hq, lq, d), lse.reshape(b, hq, lq)


# Pad when prefix**2 <= _PAD_LIMIT * q_len: a flash call over a few keys still walks every query
# block, so below this the padded rows cost less than a second call and the merge.
_PAD_LIMIT = 64


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal_offset: int | None
) -> torch.Tensor:
    """q [Lq, Hq, D], k/v [Hkv, Lk, D] -> [Lq, Hq, D] with an optional bottom-right causal mask."""
    # 4-D inputs with enable_gqa: CPU sdpa takes a several-times slower path for 3-D inputs,
    # and GQA needs no repeated copy of K/V.
    qt, kt, vt = q.transpose(0, 1)[None], k[None], v[None]
    lq, lk = q.shape[0], k.shape[1]
    cpu = q.device.type == "cpu"
    if causal_offset is None or lq == 1:
        out = _sdpa(qt, kt, vt, scale, False)
    elif cpu and q.dtype == torch.bfloat16 and lq * lk >= _MATMUL_MIN_PAIRS:
        return matmul_extend(q, k, v, scale)  # bf16 GEMMs beat CPU flash without AMX
    elif lq == lk:
        out = _sdpa(qt, kt, vt, scale, True)
    elif cpu and q.dtype in (torch.float32, torch.bfloat16):
        out = _attend_cpu_extend(qt, kt, vt, scale, causal_offset)
    else:  # other devices: their own backends (Triton on CUDA) are the fast path
        qi = torch.arange(lq, device=q.device)[:, None] + causal_offset
        ki = torch.arange(lk, device=q.device)[None, :]
        gqa = q.shape[1] != k.shape[0]
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=ki <= qi, scale=scale, enable_gqa=gqa)
    return out[0].transpose(0, 1)


# bf16 on CPU: below this many query-key pairs a single flash call's fixed cost is lower.
_MATMUL_MIN_PAIRS = 1 << 16


def extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens_k: torch.Tensor,
    scale: float,
    *,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of new tokens over their cached prefix plus themselves (already stored).

    q: [total_q, Hq, D] -> out [total_q, Hq, D].  Handles q_len == 1 (decode) too.  ``window``: a
    sliding-window layer's W; ``sinks``: a sink logit per query head (see the module docstring).
    """
    page_size = k_cache.shape[1]
    hkv, d = k_cache.shape[2:]
    kf, vf = k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d)
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    lens = seq_lens_k.tolist()
    for i, lk in enumerate(lens):
        s, e = cu[i], cu[i + 1]
        if e == s:
            continue
        prefix = lk - (e - s)
        lo = 0 if window is None else max(0, prefix - window + 1)
        slots = kv_slots(page_table[i], lk, page_size, lo)
        if sinks is not None:
            k = kf.index_select(0, slots).transpose(0, 1)
            v = vf.index_select(0, slots).transpose(0, 1)
            out[s:e] = _attend_sinks(q[s:e], k, v, scale, sinks, prefix - lo, window)
            continue
        # head-major [Hkv, Lk, D], the layout the attention GEMMs read (gather then transpose: 3x
        # faster than index_select on the transposed pool)
        k = kf.index_select(0, slots).to(q.dtype).transpose(0, 1).contiguous()
        v = vf.index_select(0, slots).to(q.dtype).transpose(0, 1).contiguous()
        if window is not None and lk - lo > window:  # some query's window starts after key lo
            out[s:e] = _attend_band(q[s:e], k, v, scale, prefix - lo, window)
        else:
            out[s:e] = _attend(q[s:e], k, v, scale, prefix - lo)
    return out


def _attend_band(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, offset: int, window: int
) -> torch.Tensor:
    """q [Lq, Hq, D] over k/v [Hkv, Lk, D] where query j sees keys ``offset + j - window < i <= offset + j``."""
    lq, lk = q.shape[0], k.shape[1]
    qi = torch.arange(lq, device=q.device)[:, None] + offset
    ki = torch.arange(lk, device=q.device)[None, :]
    mask = (ki <= qi) & (ki > qi - window)
    gqa = q.shape[1] != k.shape[0]
    qt = q.transpose(0, 1)[None]
    out = F.scaled_dot_product_attention(qt, k[None], v[None], attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out[0].transpose(0, 1)


class DecodePlan(NamedTuple):
    """Gather indices shared by every layer of one decode step (computed once, not per layer)."""

    slots: torch.Tensor  # [B * L] flat slot of each key (0 where padded)
    valid: torch.Tensor | None  # [B, L] key exists; None when every sequence has L keys (no mask needed)


def decode_plan(
    page_table: torch.Tensor, seq_lens_k: torch.Tensor, page_size: int, window: int | None = None
) -> DecodePlan:
    """The keys each sequence's new token sees: all of them, or a window layer's last ``window``."""
    if window is not None:
        return _window_decode_plan(page_table, seq_lens_k, page_size, window)
    b = page_table.shape[0]
    max_len = int(seq_lens_k.max())
    n_pages = (max_len + page_size - 1) // page_size
    offs = torch.arange(page_size, device=page_table.device)
    slots = (page_table[:, :n_pages].long()[:, :, None] * page_size + offs).reshape(b, -1)[:, :max_len]
    valid = torch.arange(max_len, device=page_table.device)[None, :] < seq_lens_k[:, None].long()
    if bool(valid.all()):  # sdpa without a mask is ~2x faster on CPU
        return DecodePlan(slots.reshape(-1), None)
    return DecodePlan(slots.masked_fill(~valid, 0).reshape(-1), valid)


def _window_decode_plan(
    page_table: torch.Tensor, seq_lens_k: torch.Tensor, page_size: int, window: int
) -> DecodePlan:
    lens = seq_lens_k.long()
    lo = (lens - window).clamp(min=0)
    width = int((lens - lo).max())
    pos = lo[:, None] + torch.arange(width, device=page_table.device)[None, :]
    valid = pos < lens[:, None]
    pos = torch.minimum(pos, lens[:, None] - 1)  # padding reads the sequence's own last key (masked)
    pages = page_table.long().gather(1, pos // page_size)
    slots = pages * page_size + pos % page_size
    return DecodePlan(slots.reshape(-1), None if bool(valid.all()) else valid)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens_k: torch.Tensor,
    scale: float,
    *,
    plan: DecodePlan | None = None,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One new token per sequence: q [B, Hq, D] -> [B, Hq, D], batched with a padding mask.

    ``plan`` must have been made with the same ``window`` (``decode_plan``)."""
    hkv, d = k_cache.shape[2:]
    b, hq, _ = q.shape
    if plan is None:
        plan = decode_plan(page_table, seq_lens_k, k_cache.shape[1], window)
    if sinks is not None:
        return _decode_sinks(q, k_cache, v_cache, plan, scale, sinks)
    # index_select, not advanced indexing: several times faster for a flat gather on CPU
    k = k_cache.view(-1, hkv, d).index_select(0, plan.slots).view(b, -1, hkv, d).to(q.dtype)
    v = v_cache.view(-1, hkv, d).index_select(0, plan.slots).view(b, -1, hkv, d).to(q.dtype)
    group = hq // hkv
    # Fold the query heads of one KV group into the query-length axis: no K/V copy per head.
    qg = q.reshape(b, hkv, group, d)
    mask = None if plan.valid is None else plan.valid[:, None, None, :]
    out = F.scaled_dot_product_attention(
        qg, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale
    )
    return out.reshape(b, hq, d)


# -- sinks ----------------------------------------------------------------------------------------
# the largest [heads, queries, keys] fp32 score block one matmul fills (64 MiB)
_SCORE_ELEMS = 1 << 24


def _softmax_sink(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """``scores [..., H, rows, keys]`` fp32 (masked keys at -inf), ``sinks [H]`` -> probabilities."""
    sink = sinks.float().view(-1, 1, 1)
    m = torch.maximum(scores.amax(-1, keepdim=True), sink)
    p = torch.exp(scores - m)
    return p / (p.sum(-1, keepdim=True) + torch.exp(sink - m))


def _attend_sinks(
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


def _decode_sinks(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: DecodePlan,
    scale: float,
    sinks: torch.Tensor,
) -> torch.Tensor:
    hkv, d = k_cache.shape[2:]
    b, hq, _ = q.shape
    k = k_cache.view(-1, hkv, d).index_select(0, plan.slots).view(b, -1, hkv, d).float()
    v = v_cache.view(-1, hkv, d).index_select(0, plan.slots).view(b, -1, hkv, d).float()
    qg = q.float().reshape(b, hkv, hq // hkv, d)
    s = torch.matmul(qg, k.permute(0, 2, 3, 1)).mul_(scale)  # [B, Hkv, group, L]
    if plan.valid is not None:
        s.masked_fill_(~plan.valid[:, None, None, :], float("-inf"))
    p = _softmax_sink(s.view(b, hq, 1, -1), sinks).view(b, hkv, hq // hkv, -1)
    return torch.matmul(p, v.transpose(1, 2)).reshape(b, hq, d).to(q.dtype)
