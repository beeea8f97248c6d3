"""The int4 linear for a few rows (``kernels/cpu/q4_linear.c``, ``QuantLinear.use_native``) against
gguf-py's own Q4_1 dequantization multiplied in float64, and row for row against itself at every row
count (speculative verification must reproduce plain decoding's bits); then greedy speculative
decoding on the embedded GGUF equals decoding without it; and the Q8_0 head's tiled kernel
(``q8_tiles``) likewise."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import quants  # noqa: E402

from kvreuse.kernels.native_cpu import Q4_ROWS, load  # noqa: E402
from kvreuse.runtime.models.quant_linear import int4_from_grid  # noqa: E402
from kvreuse.runtime.models.quantize import _grid  # noqa: E402

HAS_CC = shutil.which("cc") is not None or shutil.which("gcc") is not None
pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the torch path runs instead")
DTYPES = [torch.float32, torch.bfloat16]


class _Tensor:
    """What ``_grid`` reads from a ``GGUFReader`` tensor: its raw blocks and type."""

    def __init__(self, data: np.ndarray) -> None:
        self.data, self.tensor_type = data, T.Q4_1


@pytest.fixture(scope="module")
def ops():
    built = load()
    assert built is not None, "a C compiler is present, so the kernels must build"
    return built


def q4_1_blocks(rows: int, cols: int, seed: int) -> np.ndarray:
    """Random Q4_1 blocks (fp16 d, fp16 m, 16 bytes of two codes) whose d, m and m + 8 d are exact in
    bf16 too, so the kernel's grid is the file's exactly and only the activations are rounded."""
    rng = np.random.default_rng(seed)
    nb = cols // 32
    b = rng.integers(0, 256, size=(rows, nb, 20), dtype=np.uint8)
    d = (rng.integers(1, 16, size=(rows, nb)) * 2.0**-10).astype(np.float16)
    m = (-rng.integers(0, 32, size=(rows, nb)) * 2.0**-7).astype(np.float16)
    b[..., 0:2] = d.view(np.uint8).reshape(rows, nb, 2)
    b[..., 2:4] = m.view(np.uint8).reshape(rows, nb, 2)
    return b.reshape(rows, -1)


def _linear(ops, n: int, k: int, seed: int):
    blocks = q4_1_blocks(n, k, seed)
    w_file = torch.from_numpy(np.asarray(quants.dequantize(blocks, T.Q4_1), dtype=np.float64)).view(n, k)
    w, scale, low = _grid(_Tensor(blocks))
    q = int4_from_grid(w, scale, low, None)
    q.use_native(ops)
    assert q.native is not None and q.packed is None
    return q, w_file, low.double()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(960, 576), (576, 1536), (48, 64)])
def test_q4_linear_error_is_within_the_activation_rounding_bound(ops, dtype, n, k) -> None:
    """x is quantized per block of 32 (step d_b = max|x_b| / 127) and multiplies the codes; the block's
    offset multiplies the exact sum of x.  So each product is off by at most (W - low) * d_b / 2:
    |y - x W^T| <= sum_i (W_oi - low_ob(i)) * d_b(i) / 2, plus float rounding."""
    q, w, low = _linear(ops, n, k, seed=n + k)
    g = torch.Generator().manual_seed(k)
    for rows in (1, 3, 8, 17, Q4_ROWS):
        x = torch.randn(rows, k, generator=g).to(dtype)
        want = x.double() @ w.t()
        step = x.double().abs().view(rows, k // 32, 32).amax(-1) / 127  # [rows, blocks]
        codes_part = (w.view(n, k // 32, 32) - low[..., None]).sum(-1)  # [n, blocks], >= 0
        bound = step @ codes_part.t() / 2
        got = q.run(x).double()
        assert got.dtype == torch.float64 and got.shape == (rows, n)
        out_round = want.abs() * (2**-8 if dtype == torch.bfloat16 else 1e-6)  # the output's dtype
        slack = 1e-5 * (x.double().abs() @ w.abs().t()) + out_round
        assert bool(((got - want).abs() <= bound + slack).all()), float(((got - want).abs() - bound).max())
        assert float((got - want).abs().max()) > 1e-6  # it does quantize: a float kernel would be ~exact


@pytest.mark.parametrize("dtype", DTYPES)
def test_each_row_is_the_same_bits_at_every_row_count(ops, dtype) -> None:
    """Decoding a token alone (1 row) and verifying it among drafted rows (up to ``Q4_ROWS``) must give
    the same bits, at every position in the batch (the kernel runs rows in groups of 4)."""
    q, _, _ = _linear(ops, 576, 1536, seed=3)
    x = torch.randn(Q4_ROWS, 1536, generator=torch.Generator().manual_seed(4)).to(dtype)
    full = q.run(x)
    alone = torch.cat([q.run(x[r : r + 1]) for r in range(Q4_ROWS)])
    assert torch.equal(full, alone)
    for m in (2, 5, 7, 9, 16, 17):
        assert torch.equal(q.run(x[:m]), full[:m])
        assert torch.equal(q.run(x[Q4_ROWS - m :]), full[Q4_ROWS - m :])


def test_more_rows_take_the_dense_path_and_bias_is_added(ops) -> None:
    """Above ``Q4_ROWS`` rows (prefill) the weight is dequantized and multiplied densely; both paths
    add the bias and agree within the activation rounding."""
    q, w, _ = _linear(ops, 64, 128, seed=9)
    bias = torch.randn(64, generator=torch.Generator().manual_seed(1))
    q.bias = bias.to(torch.bfloat16)
    x = torch.randn(Q4_ROWS + 8, 128, generator=torch.Generator().manual_seed(2))
    dense = q.run(x)
    want = F.linear(x.double(), w, q.bias.double())
    torch.testing.assert_close(dense.double(), want, atol=1e-4, rtol=1e-4)  # fp32 GEMM, exact grid
    few = q.run(x[:4]).double()
    assert float((few - want[:4]).abs().max()) < 0.02 * float(want.abs().max())
    assert not torch.equal(few, dense[:4].double())  # the kernel quantized x: a different path ran


@pytest.mark.parametrize("mode,dtype", [("suffix", "bfloat16"), ("ngram", "float32")])
def test_speculative_greedy_output_equals_plain_decoding_on_the_gguf(ops, mode, dtype) -> None:
    """``--quantize gguf`` on the embedded Q4_1 GGUF: verifying drafts through the int4 kernel gives
    plain decoding's greedy tokens exactly (bf16, the default CPU dtype, and fp32): its rows run as
    decode rows (``build_forward_batch``'s ``drafts_as_decode``) through kernels that compute each row
    alone."""
    from kvreuse.runtime.engine.engine import Engine
    from kvreuse.runtime.models.quant_linear import QuantLinear
    from kvreuse.runtime.sampling.params import SamplingParams
    from tests.engine_drive import run_checked

    code = "".join(
        f"def {f}(a, b):\n    return a {op} b\n\n" for f, op in (("add", "+"), ("sub", "-"), ("mul", "*"))
    )
    chat = [{"role": "user", "content": f"Rewrite this code, adding a docstring to each function:\n{code}"}]
    sp = SamplingParams(max_tokens=48, ignore_eos=True)
    off = Engine(dtype=dtype, quantize="gguf", kv_cache_memory="32M", speculative="off")
    quant = [m for m in off.runner.model.modules() if isinstance(m, QuantLinear)]
    assert quant and all(m.native is not None for m in quant)
    ids = off.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # the model copies most of the code
    want = off.generate([ids], sp)[0]
    spec = Engine(dtype=dtype, quantize="gguf", kv_cache_memory="32M", speculative=mode)
    req = spec.make_request(ids, sp)
    run_checked(spec, [req])  # check_integrity after every step
    assert req.output_ids == want.output_token_ids, dtype
    assert req.accepted_tokens > 8, "little was accepted: the test proves little"


@pytest.mark.parametrize("dtype", DTYPES)
def test_q8_tiles_head_matches_the_row_kernel_and_is_row_invariant(ops, dtype) -> None:
    """The Q8_0 head in tiles (``BlockInt8Linear`` with the kernels): the file's codes and scales come
    back exactly, each row is within q8_linear's activation-rounding bound of float64 ``x W^T``, and
    each row's bits are the same at every row count."""
    from kvreuse.runtime.models.block_int8 import BlockInt8Linear

    n, k = 1000, 576  # n not a multiple of the 16-output tile
    g = torch.Generator().manual_seed(6)
    codes = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scales = torch.rand(n, k // 32, generator=g) * 0.01
    head = BlockInt8Linear(codes, scales, ops)
    got_codes, got_scales = head.blocks()
    assert torch.equal(got_codes, codes) and torch.equal(got_scales, scales)
    w = (codes.double().view(n, k // 32, 32) * scales.double()[..., None]).view(n, k)
    x = torch.randn(Q4_ROWS, k, generator=g).to(dtype)
    want = x.double() @ w.t()
    step = x.double().abs().view(Q4_ROWS, k // 32, 32).amax(-1) / 127
    bound = step @ w.abs().view(n, k // 32, 32).sum(-1).t() / 2
    got = head.run(x)
    slack = 1e-5 * (x.double().abs() @ w.abs().t()) + want.abs() * (
        2**-8 if dtype == torch.bfloat16 else 1e-6
    )
    assert bool(((got.double() - want).abs() <= bound + slack).all())
    assert torch.equal(torch.cat([head.run(x[r : r + 1]) for r in range(Q4_ROWS)]), got)
    assert torch.equal(head.run(x[:17]), got[:17])
