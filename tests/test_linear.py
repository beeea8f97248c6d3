"""The CPU-packed linear layer: same results as the dense one, one copy of each weight, honest fallback."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvreuse.runtime.models.linear import Linear, onednn_packs

needs_onednn = pytest.mark.skipif(
    not onednn_packs(torch.empty(1)), reason="this torch build cannot pack fp32 weights for oneDNN"
)


@needs_onednn
@pytest.mark.parametrize("rows", [0, 1, 3, 8, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_equals_dense(rows: int, bias: bool) -> None:
    torch.manual_seed(rows)
    lin = Linear(96, 160, bias=bias)
    dense_w = lin.weight.detach().clone()
    dense_b = None if lin.bias is None else lin.bias.detach().clone()
    x = torch.randn(rows, 96)
    expected = F.linear(x, dense_w, dense_b)
    assert lin.pack_for_cpu()
    assert lin.weight is None and lin.packed is not None  # one copy of the weight, not two
    with torch.inference_mode():
        got = lin.run(x)
    assert got.shape == (rows, 160)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # a strided input (a slice of a wider activation) is multiplied as its values, not its storage
    wide = torch.randn(4, 192)
    torch.testing.assert_close(lin.run(wide[:, ::2]), F.linear(wide[:, ::2], dense_w, dense_b))


def test_unsupported_dtype_keeps_dense_weight() -> None:
    lin = Linear(8, 4).to(torch.float64)
    assert not lin.pack_for_cpu()
    assert lin.packed is None and lin.weight is not None
    x = torch.randn(2, 8, dtype=torch.float64)
    torch.testing.assert_close(lin.run(x), F.linear(x, lin.weight, lin.bias))


@needs_onednn
def test_engine_packs_every_linear_and_keeps_tied_embedding(tmp_path) -> None:
    from kvreuse.runtime.runner.model_runner import ModelRunner
    from tests.helpers import make_tiny_model

    path = make_tiny_model(tmp_path / "m", arch="llama", tie=True)
    runner = ModelRunner(path, "float32", "cpu", page_size=4, kv_cache_memory=None, num_pages=8)
    linears = [m for m in runner.model.modules() if isinstance(m, Linear)]
    assert linears and all(m.packed is not None and m.weight is None for m in linears)
    assert runner.model.embed_tokens.weight.shape == (512, 64)  # the tied table survives packing its head
