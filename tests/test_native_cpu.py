"""The fused CPU decode kernels (``kernels/native_cpu.py``) against the torch ops they replace.

The oracles are the reference kernels and model layers (``kernels/reference.py``,
``runtime/models/layers.py``), which the transformers parity tests check in turn.  Where torch rounds
to bf16 the kernels round at the same points, so bf16 results must be bit-identical; fp32 differs
only in summation order.
"""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from kvreuse.kernels import reference as ref
from kvreuse.kernels.backends import select_backend
from kvreuse.kernels.native_cpu import load
from kvreuse.runtime.models.layers import RMSNorm, RotaryEmbedding, apply_rope

HAS_CC = shutil.which("cc") is not None or shutil.which("gcc") is not None
pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the torch path runs instead")
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module")
def ops():
    built = load()
    assert built is not None, "a C compiler is present, so the kernels must build"
    return built


def test_auto_backend_on_cpu_is_the_fused_one(ops) -> None:
    b = select_backend("cpu")
    assert b.name == "cpu" and b.fused is not None
    assert select_backend("cpu", "reference").fused is None


def _pool(dtype, pages=96, page_size=16, nkv=3, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(pages, page_size, nkv, d, generator=g).to(dtype)
    v = torch.randn(pages, page_size, nkv, d, generator=g).to(dtype)
    return k, v


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "nh,nkv,d", [(9, 3, 64), (4, 4, 32), (16, 2, 128), (6, 2, 48)]
)  # 48: the portable loop
def test_decode_attention_matches_reference(ops, dtype, nh, nkv, d) -> None:
    # lengths around the 512-key work split and the 64-key block, pages in a random order
    lens = torch.tensor([1, 63, 64, 65, 511, 512, 513, 1100], dtype=torch.int32)
    kc, vc = _pool(dtype, nkv=nkv, d=d)
    g = torch.Generator().manual_seed(1)
    table = torch.stack([torch.randperm(96, generator=g)[:70] for _ in lens]).to(torch.int32)
    qkv = torch.randn(len(lens), (nh + 2 * nkv) * d, generator=g).to(dtype)
    q = qkv[:, : nh * d].view(-1, nh, d)  # strided rows, as the fused layer passes them
    got = ops.decode_attention(q, kc, vc, table, lens, d**-0.5)
    want = ref.decode_attention(q.float(), kc.float(), vc.float(), table, lens, d**-0.5)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_rounds_like_the_module(ops, dtype, with_residual) -> None:
    g = torch.Generator().manual_seed(2)
    h = torch.randn(5, 576, generator=g).to(dtype)
    res = torch.randn(5, 576, generator=g).to(dtype)
    norm = RMSNorm(576, 1e-5).to(dtype)
    norm.weight.data.copy_(torch.randn(576, generator=g))
    want_h = h + res if with_residual else h
    want = norm.forward(want_h)
    got_h = h.clone()
    got = ops.rms_norm(got_h, norm.weight, norm.eps, residual=res if with_residual else None)
    if dtype == torch.bfloat16:
        assert torch.equal(got_h, want_h) and torch.equal(got, want)
    else:
        torch.testing.assert_close(got_h, want_h, atol=0, rtol=0)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_rounds_like_torch(ops, dtype) -> None:
    gu = (torch.randn(3, 2 * 1536, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    gate, up = gu.chunk(2, dim=-1)
    want = F.silu(gate) * up
    got = ops.silu_mul(gu)
    if dtype == torch.bfloat16:
        # an exp within 2 ulp of torch's can still round the other way at a bf16 tie: allow 1 ulp, rarely
        diff = (got.view(torch.int16).int() - want.view(torch.int16).int()).abs()
        assert int(diff.max()) <= 1 and int((diff > 0).sum()) <= gu.numel() // 500
    else:
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_store_matches_rope_then_store(ops, dtype, qk_norm) -> None:
    nh, nkv, d, b = 9, 3, 64, 3
    g = torch.Generator().manual_seed(4)
    qkv = torch.randn(b, (nh + 2 * nkv) * d, generator=g).to(dtype)
    cos, sin = RotaryEmbedding(d, 4096, 10000.0, None).lookup(torch.tensor([0, 700, 4000]))
    slots = torch.tensor([5, 100, 1000])
    kc, vc = _pool(dtype, nkv=nkv, d=d)
    qn = RMSNorm(d, 1e-6).to(dtype)
    kn = RMSNorm(d, 1e-6).to(dtype)
    qn.weight.data.copy_(torch.randn(d, generator=g))
    kn.weight.data.copy_(torch.randn(d, generator=g))
    q = qkv[:, : nh * d].reshape(b, nh, d)
    k = qkv[:, nh * d : (nh + nkv) * d].reshape(b, nkv, d)
    v = qkv[:, (nh + nkv) * d :].reshape(b, nkv, d)
    if qk_norm:
        q, k = qn.forward(q), kn.forward(k)
    want_q, want_k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    want_kc, want_vc = kc.clone(), vc.clone()
    ref.store_kv(want_kc, want_vc, slots, want_k, v)
    got = qkv.clone()
    ops.rope_store(got, nh, nkv, d, cos, sin, qn.weight if qk_norm else None,
                   kn.weight if qk_norm else None, 1e-6, kc, vc, slots)  # fmt: skip
    tol = 0 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got[:, : nh * d].view(b, nh, d), want_q, atol=tol, rtol=tol)
    torch.testing.assert_close(kc, want_kc, atol=tol, rtol=tol)
    assert torch.equal(vc, want_vc)


@pytest.mark.parametrize("dtype", DTYPES)
def test_q8_linear_error_is_within_the_activation_rounding_bound(ops, dtype) -> None:
    """The kernel quantizes x per block of 32 (step d_b = max|x_b| / 127): each product is off by at
    most |w| * d_b / 2, so |y - x W^T| <= sum_i |W_oi| * d_b(i) / 2 (plus float rounding)."""
    n, k = 300, 576
    g = torch.Generator().manual_seed(5)
    codes = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scales = torch.rand(n, k // 32, generator=g) * 0.01
    x = torch.randn(4, k, generator=g).to(dtype)
    w = (codes.float().view(n, k // 32, 32) * scales[..., None]).view(n, k)
    want = x.float() @ w.t()
    step = x.float().abs().view(4, k // 32, 32).amax(-1) / 127  # [rows, blocks]
    bound = (w.abs().view(n, k // 32, 32).sum(-1) @ step.t()).t() / 2  # [rows, n]
    got = ops.q8_linear(x, codes, scales).float()
    slack = 1e-4 + (want.abs() * (1e-5 if dtype == torch.float32 else 8e-3))
    assert bool(((got - want).abs() <= bound + slack).all())
    assert float((got - want).abs().max()) > 0  # it does quantize: a float kernel would give ~0


def test_fused_decode_engine_matches_the_reference_backend(ops, tmp_path, monkeypatch) -> None:
    """Whole decode steps: the fused path and the torch path give the same greedy tokens and close
    logprobs on a tiny Qwen3 (q/k norm) with batched streams."""
    import kvreuse.runtime.models.decoder as decoder
    from kvreuse.runtime.engine.engine import Engine
    from kvreuse.runtime.sampling.params import SamplingParams
    from tests.helpers import make_tiny_model

    fused_calls = []
    real = decoder.fused_decode_layer
    monkeypatch.setattr(decoder, "fused_decode_layer", lambda *a: fused_calls.append(1) or real(*a))

    path = make_tiny_model(tmp_path / "m", arch="qwen3", vocab=512, seed=3)
    prompts = [[5, 9, 17, 33, 2 + i] * (3 + 7 * i) for i in range(3)]
    params = SamplingParams(max_tokens=24, ignore_eos=True, logprobs=1)
    outs = {}
    for backend in ("reference", "cpu"):
        e = Engine(
            model_dir=str(path), dtype="float32", device="cpu", num_pages=64, attention_backend=backend
        )
        before = len(fused_calls)
        outs[backend] = e.generate(prompts, params)
        assert e.runner.backend.name == backend
        assert (len(fused_calls) > before) == (backend == "cpu")  # the fused layers really ran
    for a, b in zip(outs["reference"], outs["cpu"]):
        assert a.output_token_ids == b.output_token_ids
        la = torch.tensor([entry[1][0] for entry in a.logprobs])  # (token, (logprob, top))
        lb = torch.tensor([entry[1][0] for entry in b.logprobs])
        assert len(la) == params.max_tokens
        torch.testing.assert_close(la, lb, atol=1e-4, rtol=1e-4)


def test_embedded_gguf_head_keeps_its_q8_0_blocks_and_tracks_the_dense_model(ops) -> None:
    """``--quantize gguf`` on the embedded Q4_1 GGUF: the tied head is the file's Q8_0 blocks (checked
    against gguf-py's own dequantization), and scoring a text through the decode kernels (chunks of 8
    rows: the head's block kernel) stays within 2% perplexity of the dequantized fp32 model."""
    import math

    import numpy as np
    from gguf import GGUFReader, quants

    from kvreuse.runtime.engine.engine import Engine
    from kvreuse.runtime.loading.model_source import embedded_gguf_path
    from kvreuse.runtime.models.block_int8 import BlockInt8Linear

    q = Engine(dtype="bfloat16", quantize="gguf", kv_cache_memory="32M")
    dense = Engine(dtype="float32", kv_cache_memory="32M")
    head = q.runner.model.lm_head
    assert isinstance(head, BlockInt8Linear) and q.runner.backend.name == "cpu"
    t = next(t for t in GGUFReader(str(embedded_gguf_path())).tensors if t.name == "token_embd.weight")
    want = torch.from_numpy(
        np.asarray(quants.dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32)
    )
    torch.testing.assert_close(head.dequantize(torch.float32), want.reshape(head.out_features, -1))
    text = q.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 6, add_special_tokens=False)

    def ppl(e: Engine, chunk: int | None) -> float:
        entries = e.prompt_logprobs(text, 0, chunk)
        return math.exp(-sum(entry[0] for _, entry in entries[1:]) / (len(text) - 1))

    ratio = ppl(q, 8) / ppl(dense, None)
    assert 0.98 < ratio < 1.02, ratio


@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_kernel_rounds_like_the_torch_ops(ops, kind, dtype) -> None:
    """QuantLinear's prefill weight: one C pass and its four torch ops give the same bits."""
    from kvreuse.runtime.models.quant_linear import DequantScratch, quantize_int4, quantize_int8

    g = torch.Generator().manual_seed(8)
    w = torch.randn(48, 576, generator=g) * torch.rand(48, 1, generator=g)  # scales vary by row
    q = (quantize_int4 if kind == "int4" else quantize_int8)(w)
    q.scratch = DequantScratch()
    want = q.dequantize(dtype).clone()
    q.scratch = DequantScratch(ops)
    got = q.dequantize(dtype)
    assert got.dtype == dtype and torch.equal(got, want)
    assert float((want.float() - w).abs().max()) < float(w.abs().max()) / 8  # it is the weight
