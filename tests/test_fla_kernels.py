"""fla-core's Triton gated delta rule against our torch reference, on the CPU under TRITON_INTERPRET=1.

fla-core is in the ``gpu`` extra (not installed by the test extra), so this skips without it.  Its
recurrent kernel runs under the interpreter; its chunked kernel asks the Triton driver for a device
at launch, so on a CPU it is skipped with that reason (on a GPU the same test runs it).
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first `import triton`
fla_ops = pytest.importorskip(
    "fla.ops.gated_delta_rule", reason="fla-core is not installed (pip install fla-core)"
)

from kvreuse.kernels.gated_delta import recurrent_gated_delta_step  # noqa: E402


def _inputs(seed: int, t: int = 12, h: int = 2, d: int = 16):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, t, h, d, generator=g) for _ in range(3))
    decay = -torch.rand(1, t, h, generator=g)  # log decay per step, as both take it
    beta = torch.rand(1, t, h, generator=g)
    state = torch.randn(1, h, d, d, generator=g) * 0.1
    return q, k, v, decay, beta, state


def _reference(q, k, v, decay, beta, state):
    outs = []
    for i in range(q.shape[1]):
        o, state = recurrent_gated_delta_step(q[:, i], k[:, i], v[:, i], decay[:, i], beta[:, i], state)
        outs.append(o)
    return torch.stack(outs, 1), state


@pytest.mark.parametrize("seed", (0, 1))
def test_fla_fused_recurrent_matches_reference(seed):
    q, k, v, decay, beta, state = _inputs(seed)
    ref_o, ref_s = _reference(q, k, v, decay, beta, state)
    o, s = fla_ops.fused_recurrent_gated_delta_rule(
        q,
        k,
        v,
        g=decay,
        beta=beta,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    assert (o.float() - ref_o).abs().max().item() < 1e-4
    assert (s.float() - ref_s).abs().max().item() < 1e-4


def test_fla_chunk_matches_reference():
    q, k, v, decay, beta, state = _inputs(2)
    ref_o, ref_s = _reference(q, k, v, decay, beta, state)
    try:
        o, s = fla_ops.chunk_gated_delta_rule(
            q,
            k,
            v,
            g=decay,
            beta=beta,
            initial_state=state,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
    except RuntimeError as e:
        if "active drivers" in str(e):
            pytest.skip(f"fla's chunked kernel needs a GPU driver at launch: {e}")
        raise
    assert (o.float() - ref_o).abs().max().item() < 1e-4
    assert (s.float() - ref_s).abs().max().item() < 1e-4
