"""Gated DeltaNet kernels: our varlen reference against transformers' per-sequence torch functions,
chunked prefill against token-by-token recurrence, and states captured inside a chunk against
running the prefix alone."""

from __future__ import annotations

import pytest
import torch

from kvreuse.kernels.gated_delta import (
    causal_conv1d,
    causal_conv1d_step,
    chunk_gated_delta_rule,
    recurrent_gated_delta_step,
)
from kvreuse.kernels.linear_attention import chunk_with_captures, select_linear_backend

LENS = [1, 5, 64, 65, 130]


def _inputs(lens, hk=2, hv=4, dk=8, dv=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = sum(lens)
    q = torch.randn(t, hk, dk, generator=g)
    k = torch.randn(t, hk, dk, generator=g)
    v = torch.randn(t, hv, dv, generator=g)
    gate = -torch.rand(t, hv, generator=g) * 2  # log decay <= 0
    beta = torch.rand(t, hv, generator=g)
    state = torch.randn(len(lens), hv, dk, dv, generator=g)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return q, k, v, gate, beta, state, cu


def test_chunk_matches_transformers_per_sequence():
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    q, k, v, g, beta, state, cu = _inputs(LENS)
    out, final = chunk_gated_delta_rule(q, k, v, g, beta, cu, state)
    for i in range(len(LENS)):
        s, e = cu[i], cu[i + 1]
        ref_o, ref_s = torch_chunk_gated_delta_rule(
            q[None, s:e], k[None, s:e], v[None, s:e], g[None, s:e], beta[None, s:e],
            initial_state=state[i : i + 1], output_final_state=True, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        assert torch.allclose(out[s:e], ref_o[0], atol=1e-5), i
        assert torch.allclose(final[i], ref_s[0], atol=1e-5), i


def test_chunk_equals_token_by_token_recurrence():
    q, k, v, g, beta, state, cu = _inputs(LENS, seed=1)
    out, final = chunk_gated_delta_rule(q, k, v, g, beta, cu, state)
    for i in range(len(LENS)):
        st = state[i : i + 1]
        for t in range(cu[i], cu[i + 1]):
            o, st = recurrent_gated_delta_step(
                q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], st
            )
            assert torch.allclose(o[0], out[t], atol=1e-4), (i, t)
        assert torch.allclose(st[0], final[i], atol=1e-4), i


def test_recurrent_step_matches_transformers():
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

    q, k, v, g, beta, state, _ = _inputs([1, 1, 1], seed=2)
    out, new = recurrent_gated_delta_step(q, k, v, g, beta, state)
    ref_o, ref_s = torch_recurrent_gated_delta_rule(
        q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None],
        initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    assert torch.allclose(out, ref_o[:, 0], atol=1e-6)
    assert torch.allclose(new, ref_s, atol=1e-6)


@pytest.mark.parametrize("cuts", [[[], [2], [10, 64], [], [1, 2, 129]], [[], [], [], [], []]])
def test_captured_states_equal_running_the_prefix(cuts):
    q, k, v, g, beta, state, cu = _inputs(LENS, seed=3)
    ref_out, ref_final = chunk_gated_delta_rule(q, k, v, g, beta, cu, state)
    out, final, caught = chunk_with_captures(chunk_gated_delta_rule, q, k, v, g, beta, cu, state, cuts)
    assert torch.allclose(out, ref_out, atol=1e-5)
    assert torch.allclose(final, ref_final, atol=1e-5)
    m = 0
    for i, cs in enumerate(cuts):
        for c in cs:
            s = cu[i]
            _, st = chunk_gated_delta_rule(
                q[s : s + c],
                k[s : s + c],
                v[s : s + c],
                g[s : s + c],
                beta[s : s + c],
                [0, c],
                state[i : i + 1],
            )
            assert torch.allclose(caught[m], st[0], atol=1e-5), (i, c)
            m += 1
    assert m == len(caught)


def test_conv_varlen_continues_and_matches_steps():
    from transformers.models.qwen3_5.modeling_qwen3_5 import causal_conv1d_fn

    g = torch.Generator().manual_seed(4)
    c, kw, lens = 6, 4, [1, 2, 7]
    x = torch.randn(sum(lens), c, generator=g)
    w = torch.randn(c, kw, generator=g)
    cu = [0, 1, 3, 10]
    zero = torch.zeros(len(lens), c, kw - 1)
    y, st = causal_conv1d(x, w, cu, zero)
    for i in range(len(lens)):  # from a zero state == transformers' zero-padded conv
        ref = causal_conv1d_fn(x[None, cu[i] : cu[i + 1]].transpose(1, 2), w, activation="silu")
        assert torch.allclose(y[cu[i] : cu[i + 1]], ref[0].t(), atol=1e-6)
    # continuing: the 7-token sequence as 3 + 4 equals it in one go; step by step too
    x7 = x[3:10]
    y1, s1 = causal_conv1d(x7[:3], w, [0, 3], zero[:1])
    y2, s2 = causal_conv1d(x7[3:], w, [0, 4], s1)
    assert torch.allclose(torch.cat([y1, y2]), y[3:10], atol=1e-6)
    assert torch.allclose(s2, st[2:3])
    s = zero[:1]
    for t in range(7):
        yt, s = causal_conv1d_step(x7[t : t + 1], w, s)
        assert torch.allclose(yt[0], y[3 + t], atol=1e-6)


def test_backend_selection():
    assert select_linear_backend("cpu").name == "reference"
    with pytest.raises(ValueError, match="unknown linear-attention backend"):
        select_linear_backend("cpu", "nope")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fla's Triton kernels need CUDA")
def test_fla_matches_reference_on_gpu():
    pytest.importorskip("fla")
    fla = select_linear_backend("cuda", "fla")
    q, k, v, g, beta, state, cu = _inputs(LENS, seed=5)
    dev = [x.cuda() for x in (q, k, v, g, beta, state)]
    out, final = fla.chunk(*dev[:5], cu, dev[5])
    ref_out, ref_final = chunk_gated_delta_rule(q, k, v, g, beta, cu, state)
    assert torch.allclose(out.cpu(), ref_out, atol=2e-3)
    assert torch.allclose(final.cpu(), ref_final, atol=2e-3)
    o1, s1 = fla.step(*(x[:3] for x in dev[:5]), dev[5][:3])
    r1, rs = recurrent_gated_delta_step(*(x[:3] for x in (q, k, v, g, beta)), state[:3])
    assert torch.allclose(o1.cpu(), r1, atol=2e-3) and torch.allclose(s1.cpu(), rs, atol=2e-3)
