"""Quantized linears against gguf-py's own dequantization (an independent oracle) and dense math."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import quants  # noqa: E402

from kvreuse.runtime.models.quant_linear import (  # noqa: E402
    int4_from_grid,  # noqa: E402
    quantize_int4,
    quantize_int8,
)
from kvreuse.runtime.models.quantize import _grid, _unpermute_rows  # noqa: E402

BLOCK_BYTES = {T.Q4_0: 18, T.Q4_1: 20, T.Q8_0: 34, T.Q4_K: 144, T.Q6_K: 210}
BLOCK_VALUES = {T.Q4_0: 32, T.Q4_1: 32, T.Q8_0: 32, T.Q4_K: 256, T.Q6_K: 256}


class FakeTensor:
    """What ``_grid`` reads from a ``GGUFReader`` tensor: its raw blocks and type."""

    def __init__(self, data: np.ndarray, kind) -> None:
        self.data, self.tensor_type = data, kind


def random_blocks(kind, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random but valid blocks: arbitrary code bytes, small positive f16 scales (and mins)."""
    rng = np.random.default_rng(seed)
    n = cols // BLOCK_VALUES[kind]
    b = rng.integers(0, 256, size=(rows, n, BLOCK_BYTES[kind]), dtype=np.uint8)
    f16 = lambda size: rng.uniform(0.001, 0.02, size).astype(np.float16).view(np.uint8)  # noqa: E731
    if kind in (T.Q4_0, T.Q8_0, T.Q4_K, T.Q4_1):
        b[..., 0:2] = f16((rows, n, 1)).reshape(rows, n, 2)
    if kind in (T.Q4_1, T.Q4_K):
        b[..., 2:4] = f16((rows, n, 1)).reshape(rows, n, 2)
    if kind == T.Q6_K:
        b[..., 208:210] = f16((rows, n, 1)).reshape(rows, n, 2)
    return b.reshape(rows, -1)


def oracle(blocks: np.ndarray, kind) -> torch.Tensor:
    return torch.from_numpy(np.asarray(quants.dequantize(blocks, kind), dtype=np.float32)).reshape(
        blocks.shape[0], -1
    )


@pytest.mark.parametrize("kind", [T.Q4_0, T.Q4_1, T.Q4_K])
def test_4bit_gguf_blocks_map_to_the_same_codes(kind) -> None:
    rows, cols = 96, 512
    blocks = random_blocks(kind, rows, cols, seed=int(kind))
    w_ref = oracle(blocks, kind)
    w, scale, low = _grid(FakeTensor(blocks, kind))
    assert scale is not None
    q = int4_from_grid(w, scale, low, None)
    # codes and grid are exact; the only error is rounding scale and zero to bf16 (2^-8 relative)
    deq = q.dequantize(torch.float32)
    err = (deq - w_ref).abs().max() / w_ref.abs().max()
    assert err < 1e-2, err
    x = torch.randn(3, cols)
    for rows_in in (1, 5, 40):  # the packed kernel and the dequantize-then-dense path
        xi = torch.randn(rows_in, cols)
        y = q.run(xi)
        expected = xi @ w_ref.t()
        assert (y - expected).abs().max() / expected.abs().max() < 3e-2
    assert x.shape[1] == q.in_features


@pytest.mark.parametrize("kind", [T.Q8_0, T.Q6_K])
def test_8bit_and_6bit_blocks_requantize_to_int8_rows(kind) -> None:
    rows, cols = 64, 256
    blocks = random_blocks(kind, rows, cols, seed=3)
    w_ref = oracle(blocks, kind)
    w, scale, _ = _grid(FakeTensor(blocks, kind))
    assert scale is None
    q = quantize_int8(w)
    err = (q.dequantize() - w_ref).abs() / w_ref.abs().amax(1, keepdim=True)
    assert err.max() <= 0.5 / 127 + 4e-3  # half a step of the row's int8 grid + bf16 scale rounding
    x = torch.randn(1, cols)
    assert (q.run(x) - x @ w_ref.t()).abs().max() < 3e-2 * (x @ w_ref.t()).abs().max()


def test_dense_int4_and_int8_quantization_error_is_bounded() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(128, 256, generator=g) * 0.05
    x = torch.randn(2, 256, generator=g)
    for q, tol in ((quantize_int4(w), 0.1), (quantize_int8(w), 0.02)):
        rel = (q.dequantize() - w).norm() / w.norm()
        assert rel < tol, (q.kind, rel)
        assert q.run(x).shape == (2, 128)


def test_unpermute_matches_transformers_gguf_loader() -> None:
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rows, heads = 48, 3
    w = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    expected = LlamaTensorProcessor(config={})._reverse_permute_weights(w, heads, heads)
    assert np.array_equal(w[_unpermute_rows(rows, heads).numpy()], expected)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantized_engine_tracks_the_dense_one(tmp_path, mode: str) -> None:
    """A tiny HF model under --quantize: every decoder linear swapped, next-token logits close to dense."""
    from kvreuse.runtime.models.quant_linear import QuantLinear
    from kvreuse.runtime.sampling.params import SamplingParams
    from tests.engine_drive import generate_checked, tiny_engine
    from tests.helpers import make_tiny_model

    path = make_tiny_model(tmp_path / "m", arch="qwen2")  # qkv bias exercises the quantized bias path
    opts = dict(dtype="float32", device="cpu", num_pages=32, page_size=4, record_logits=True)
    dense, quant = tiny_engine(path, quantize="none", **opts), tiny_engine(path, quantize=mode, **opts)
    swapped = [m for m in quant.runner.model.modules() if isinstance(m, QuantLinear)]
    assert len(swapped) == 2 * 4  # two layers x (qkv, o, gate_up, down)
    prompt = list(range(3, 40))
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    (a,), (b,) = generate_checked(dense, [prompt], [params]), generate_checked(quant, [prompt], [params])
    la, lb = torch.stack(a.logits_trace), torch.stack(b.logits_trace)
    rel = (la[0] - lb[0]).norm() / la[0].norm()  # the first row: same prompt, no divergence yet
    assert rel < (0.05 if mode == "int8" else 0.2), rel


def test_quantize_gguf_without_a_gguf_is_a_clear_error(tmp_path) -> None:
    from kvreuse.runtime.engine.engine import Engine
    from tests.helpers import make_tiny_model

    path = make_tiny_model(tmp_path / "m")
    with pytest.raises(ValueError, match="needs a model loaded from a .gguf"):
        Engine(model_dir=str(path), dtype="float32", device="cpu", num_pages=8, quantize="gguf")
