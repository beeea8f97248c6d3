"""Gated DeltaNet kernels (Qwen3.5 / Qwen3-Next linear attention): pure-torch reference, the oracle.

Layout (one flat varlen batch, like the attention kernels)::

    x / q / k / v  : [T, heads, dim]   rows of seq i are cu_seqlens[i] : cu_seqlens[i+1]
    g, beta        : [T, v_heads]      g = log decay (<= 0), beta = write strength in (0, 1)
    state          : [N, v_heads, k_dim, v_dim] fp32, one recurrent state per sequence
    conv_state     : [N, channels, kernel - 1], the last inputs of the short causal convolution

Each query/key head serves ``v_heads // k_heads`` consecutive value heads (grouped value attention).
q and k are L2-normalised inside (``use_qk_l2norm_in_kernel`` in fla), q scaled by ``k_dim ** -0.5``.
The chunked prefill follows transformers' ``torch_chunk_gated_delta_rule`` step for step (64-token
chunks from each sequence's first token), so logits match it to fp32 rounding.  Sequences of one
chunk or less (a speculative draft's verify rows, short prompt tails) run together in one call,
padded with zeros (which change no state) only to a multiple of 16 rather than 64: a batch-8 verify
step spent most of its time in the per-sequence, 64-padded calls (benchmarks/serving/speculative.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prep(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand q/k heads to the value heads, fp32, L2-normalised; q scaled."""
    rep = v.shape[-2] // k.shape[-2]
    if rep > 1:
        q, k = q.repeat_interleave(rep, dim=-2), k.repeat_interleave(rep, dim=-2)
    q, k = l2norm(q.float()), l2norm(k.float())
    return q * q.shape[-1] ** -0.5, k


def _chunk_one(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    size: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, heads first: q/k [H, L, Dk], v [H, L, Dv], g/beta [H, L], state [H, Dk, Dv]
    (or several of equal padded length, their heads stacked); ``size``: the chunk length."""
    length = q.shape[1]
    pad = (size - length % size) % size
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    h = q.shape[0]
    q, k, v = (x.reshape(h, -1, size, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(h, -1, size), beta.reshape(h, -1, size)
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    upper = torch.ones(size, size, dtype=torch.bool, device=q.device).triu(1)
    cum = g.cumsum(-1)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()
    ut = (k_beta @ k.transpose(-1, -2)) * decay
    intra = (q @ k.transpose(-1, -2)) * decay
    # the UT transform: several delta-rule updates condensed into triangular solves
    u = torch.linalg.solve_triangular(ut, v_beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(ut, k_beta * cum.exp()[..., None], upper=False, unitriangular=True)
    q = q * cum.exp()[..., None]
    k = k * (cum[..., -1:] - cum).exp()[..., None]
    chunk_decay = cum[..., -1].exp()[..., None, None]
    out = torch.empty_like(u)
    for i in range(q.shape[1]):
        v_new = u[:, i] - w[:, i] @ state
        out[:, i] = q[:, i] @ state + intra[:, i] @ v_new
        state = state * chunk_decay[:, i] + k[:, i].transpose(-1, -2) @ v_new
    return out.reshape(h, -1, out.shape[-1])[:, :length], state


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: list[int],
    initial_state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill chunks: out [T, Hv, Dv] (v's dtype) and each sequence's final state [N, Hv, Dk, Dv] fp32."""
    qf, kf = _prep(q, k, v)
    vf, gf, bf = v.float(), g.float(), beta.float()
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    final = torch.empty_like(initial_state, dtype=torch.float32)
    short = [i for i in range(len(cu_seqlens) - 1) if 0 < cu_seqlens[i + 1] - cu_seqlens[i] <= CHUNK]
    if len(short) > 1:
        _short_together(qf, kf, vf, gf, bf, cu_seqlens, initial_state, short, out, final)
    for i in range(len(cu_seqlens) - 1):
        s, e = cu_seqlens[i], cu_seqlens[i + 1]
        if e == s:
            final[i] = initial_state[i]
            continue
        if len(short) > 1 and e - s <= CHUNK:
            continue
        o, st = _chunk_one(
            qf[s:e].transpose(0, 1), kf[s:e].transpose(0, 1), vf[s:e].transpose(0, 1),
            gf[s:e].t(), bf[s:e].t(), initial_state[i].float(),
        )  # fmt: skip
        out[s:e], final[i] = o.transpose(0, 1), st
    return out.to(v.dtype), final


def _short_together(qf, kf, vf, gf, bf, cu_seqlens, initial_state, short, out, final) -> None:
    """Sequences ``short`` (each one chunk or less) in one ``_chunk_one`` call: zero-padded to a common
    length, a multiple of 16, their heads stacked; writes their rows of ``out`` and ``final``."""
    lens = [cu_seqlens[i + 1] - cu_seqlens[i] for i in short]
    size = min(CHUNK, -(-max(lens) // 16) * 16)
    h = vf.shape[1]

    def stack(x: torch.Tensor) -> torch.Tensor:  # [T, H, ...] -> [n * H, size, ...]
        parts = [x[cu_seqlens[i] : cu_seqlens[i + 1]] for i in short]
        padded = torch.nn.utils.rnn.pad_sequence(parts, batch_first=True)  # [n, longest, H, ...]
        padded = F.pad(padded, (0, 0) * (x.dim() - 2) + (0, 0, 0, size - padded.shape[1]))
        return padded.transpose(1, 2).flatten(0, 1)

    q, k, v, g, b = (stack(x) for x in (qf, kf, vf, gf, bf))
    state = initial_state[short].float().flatten(0, 1)
    o, st = _chunk_one(q, k, v, g, b, state, size)
    o = o.unflatten(0, (len(short), h))
    st = st.unflatten(0, (len(short), h))
    for j, (i, n) in enumerate(zip(short, lens)):
        out[cu_seqlens[i] : cu_seqlens[i + 1]] = o[j, :, :n].transpose(0, 1)
        final[i] = st[j]


def recurrent_gated_delta_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode: one token per sequence. q/k [B, Hk, Dk], v [B, Hv, Dv], state [B, Hv, Dk, Dv] -> (out, new state)."""
    qf, kf = _prep(q, k, v)
    state = state.float() * g.float().exp()[..., None, None]
    kv_mem = (state * kf[..., None]).sum(-2)
    delta = (v.float() - kv_mem) * beta.float()[..., None]
    state = state + kf[..., None] * delta[..., None, :]
    out = (state * qf[..., None]).sum(-2)
    return out.to(v.dtype), state


def causal_conv1d(
    x: torch.Tensor, weight: torch.Tensor, cu_seqlens: list[int], conv_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv + SiLU over each sequence, continuing from ``conv_state`` [N, C, K-1].

    x [T, C], weight [C, K] -> (y [T, C], new conv_state [N, C, K-1]).
    """
    kw = weight.shape[1]
    y = torch.empty_like(x)
    new_state = torch.empty_like(conv_state)
    for i in range(len(cu_seqlens) - 1):
        s, e = cu_seqlens[i], cu_seqlens[i + 1]
        xp = torch.cat([conv_state[i].to(x.dtype), x[s:e].t()], dim=-1)  # [C, K-1+L]
        out = F.conv1d(xp[None], weight[:, None, :].to(x.dtype), groups=weight.shape[0])[0]
        y[s:e] = F.silu(out).t()
        new_state[i] = xp[:, xp.shape[1] - (kw - 1) :]
    return y, new_state


def causal_conv1d_step(
    x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode: x [B, C], conv_state [B, C, K-1] -> (y [B, C], new conv_state)."""
    window = torch.cat([conv_state.to(x.dtype), x[:, :, None]], dim=-1)  # [B, C, K]
    y = F.silu((window * weight.to(x.dtype)).sum(-1))
    return y, window[:, :, 1:]
