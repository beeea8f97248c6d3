"""Gated DeltaNet kernels chosen by device, and the capture of states inside a prefill chunk.

``reference`` (``kernels/gated_delta.py``, torch) runs everywhere and is the oracle; ``fla`` uses
fla-core's Triton kernels on CUDA (varlen through ``cu_seqlens``, one initial state per sequence,
so they take our flat batch as it is).  The short convolution stays in torch on both: it is a
4-tap depthwise filter, memory-bound, a small part of a layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from kvreuse.kernels import gated_delta as ref


class LinearAttnBackend(NamedTuple):
    """``chunk(q, k, v, g, beta, cu_seqlens: list[int], initial_state) -> (out, final_state)`` for
    prefill chunks and ``step(q, k, v, g, beta, state) -> (out, new_state)`` for decode."""

    name: str
    chunk: Callable
    step: Callable


def select_linear_backend(device: torch.device | str, name: str = "auto") -> LinearAttnBackend:
    """``auto``: fla's Triton kernels on CUDA when fla-core is installed, else the torch reference."""
    device = torch.device(device)
    if name == "auto":
        name = "fla" if device.type == "cuda" and _fla_available() else "reference"
    if name == "reference":
        return LinearAttnBackend("reference", ref.chunk_gated_delta_rule, ref.recurrent_gated_delta_step)
    if name == "fla":
        return LinearAttnBackend("fla", _fla_chunk, _fla_step)
    raise ValueError(f"unknown linear-attention backend {name!r} (expected auto, reference or fla)")


def _fla_available() -> bool:
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
    except ImportError:
        return False
    return True


def _fla_chunk(q, k, v, g, beta, cu_seqlens, initial_state):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    rep = v.shape[-2] // k.shape[-2]
    if rep > 1:  # fla expects as many q/k heads as value heads
        q, k = q.repeat_interleave(rep, dim=-2), k.repeat_interleave(rep, dim=-2)
    cu = torch.tensor(cu_seqlens, dtype=torch.long, device=q.device)
    o, final = chunk_gated_delta_rule(
        q[None], k[None], v[None], g[None].float(), beta[None].to(q.dtype),
        initial_state=initial_state.float(), output_final_state=True, cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    return o[0].to(v.dtype), final.float()


def _fla_step(q, k, v, g, beta, state):
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    rep = v.shape[-2] // k.shape[-2]
    if rep > 1:
        q, k = q.repeat_interleave(rep, dim=-2), k.repeat_interleave(rep, dim=-2)
    o, new = fused_recurrent_gated_delta_rule(
        q[:, None], k[:, None], v[:, None], g[:, None].float(), beta[:, None].to(q.dtype),
        initial_state=state.float(), output_final_state=True, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    return o[:, 0].to(v.dtype), new.float()


def chunk_with_captures(
    chunk: Callable,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: list[int],
    initial_state: torch.Tensor,
    cuts: list[list[int]],
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """``chunk`` over the batch, also returning the state at each cut (an offset inside a sequence's chunk).

    A sequence with cuts ``c1 < c2`` runs as segments ``[0, c1) [c1, c2) [c2, len)``; round r runs the
    r-th segment of every sequence in one varlen call, from the state round r-1 left.  Returns
    (out, final states, captured states in sequence-then-cut order).
    """
    if not any(cuts):
        out, final = chunk(q, k, v, g, beta, cu_seqlens, initial_state)
        return out, final, []
    bounds = [[0, *c, cu_seqlens[i + 1] - cu_seqlens[i]] for i, c in enumerate(cuts)]
    state = initial_state.float().clone()
    out = torch.empty_like(v)
    got: dict[tuple[int, int], torch.Tensor] = {}
    for r in range(max(len(b) for b in bounds) - 1):
        seqs = [i for i, b in enumerate(bounds) if r < len(b) - 1]
        rows = [torch.arange(cu_seqlens[i] + bounds[i][r], cu_seqlens[i] + bounds[i][r + 1]) for i in seqs]
        seg_cu = [0]
        for x in rows:
            seg_cu.append(seg_cu[-1] + len(x))
        idx = torch.cat(rows).to(q.device)
        sel = torch.tensor(seqs, device=q.device)
        o, st = chunk(q[idx], k[idx], v[idx], g[idx], beta[idx], seg_cu, state[sel])
        out[idx] = o
        state[sel] = st
        for j, i in enumerate(seqs):
            if r < len(cuts[i]):
                got[(i, r)] = st[j].clone()
    captured = [got[(i, r)] for i, c in enumerate(cuts) for r in range(len(c))]
    return out, state, captured
