"""The fp32 flash extend kernel (``kernels/cpu/extend_attention_f32.c``) against the torch reference.

The oracle is ``kvreuse.kernels.reference.extend_attention`` run in float64 on the same inputs (the
reference is checked against transformers by the parity tests; windows and sinks against
transformers' own masks in ``tests/test_sink_kernels.py``).  Shapes: prefix and new lengths around
the kernel's 16-key vectors, 64-key packing runs and 128-key softmax blocks, a 1-token extend, a cold
prompt, GQA groups of 1-8 and head sizes 64-256.  The AVX2 and portable builds (what CPUs without
AVX-512 run) are built here with the wider ISAs turned off and held to the same oracle.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from kvreuse.kernels import reference as ref
from kvreuse.kernels.cpu_build import compile_library
from kvreuse.kernels.native_cpu import SOURCES, load
from tests.paged_pool import poisoned_pool
from tests.test_extend_kernel import SEQS, _batch

HAS_CC = shutil.which("cc") is not None or shutil.which("gcc") is not None
pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the torch path runs instead")
F32_SOURCE = next(s for s in SOURCES if s.name == "extend_attention_f32.c")
# what a CPU without AVX-512 (AVX2 + FMA), and one without AVX at all, compiles from the same source
VARIANTS = {
    "native": (),
    "avx2": ("-mno-avx512f",),
    "portable": ("-mno-avx512f", "-mno-avx2", "-mno-fma", "-mno-avx"),
}


@pytest.fixture(scope="module")
def ops():
    built = load()
    assert built is not None, "a C compiler is present, so the kernels must build"
    return built


def _oracle(q, k, v, table, cu, lens, scale, window=None, sinks=None) -> torch.Tensor:
    out = ref.extend_attention(
        q.double(), k.double(), v.double(), table, cu, lens, scale, window=window, sinks=sinks
    )
    return out.float()


def _counting(ops, monkeypatch) -> list:
    calls: list = []
    real = ops.extend_f32
    monkeypatch.setattr(ops, "extend_f32", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize("window", [None, 5, 100, 700])
@pytest.mark.parametrize("nh,nkv,d", [(9, 3, 64), (4, 4, 64), (16, 2, 128), (8, 1, 256)])
def test_f32_kernel_matches_the_float64_reference(ops, monkeypatch, nh, nkv, d, window) -> None:
    q, k, v, table, cu, lens = _batch(SEQS, nh, nkv, d, dtype=torch.float32, seed=nh + d)
    calls = _counting(ops, monkeypatch)
    got = ops.extend_attention(q, k, v, table, cu, lens, d**-0.5, window=window)
    assert calls, "the fp32 flash kernel served the extend"
    assert got.dtype == torch.float32 and got.shape == q.shape
    want = _oracle(q, k, v, table, cu, lens, d**-0.5, window)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    # as close to float64 as torch's own fp32 attention (the reference path it replaces), within 2x:
    # at D = 256 each score is one 256-term fp32 sum (measured 1.7x torch's mean error, 2e-7)
    torch_f32 = ref.extend_attention(q, k, v, table, cu, lens, d**-0.5, window=window)
    assert float((got - want).abs().mean()) <= 2 * float((torch_f32 - want).abs().mean())


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("window", [None, 37])
def test_every_isa_build_matches_the_reference_with_sinks(ops, monkeypatch, variant, window) -> None:
    """The AVX2 (8 lanes, 3 rows) and portable (4 lanes, 2 rows) builds tile differently: same results."""
    lib = compile_library(F32_SOURCE, VARIANTS[variant])
    assert lib is not None, f"the {variant} build must compile"
    fn = lib.extend_attention_f32
    fn.restype, fn.argtypes = ops.extend_f32.restype, ops.extend_f32.argtypes
    monkeypatch.setattr(ops, "extend_f32", fn)
    nh, nkv, d = 9, 3, 64
    q, k, v, table, cu, lens = _batch(SEQS, nh, nkv, d, dtype=torch.float32, seed=5)
    sinks = torch.randn(nh, generator=torch.Generator().manual_seed(1)) * 4
    sinks[0] = 30.0  # a head whose weight goes almost all to the sink
    got = ops.extend_attention(q, k, v, table, cu, lens, 0.125, window=window, sinks=sinks)
    want = _oracle(q, k, v, table, cu, lens, 0.125, window, sinks)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_windowed_extend_never_reads_keys_before_the_band(ops, monkeypatch) -> None:
    """Slots before each sequence's first visible key are NaN (a window layer's ring reuses them)."""
    gen = torch.Generator().manual_seed(3)
    seq_lens, q_lens, window = [300, 1200, 40, 9], [70, 130, 1, 9], 64
    kc, vc, table, dense = poisoned_pool(seq_lens, q_lens, window, 2, 64, 16, gen)
    q = torch.randn(sum(q_lens), 8, 64, generator=gen)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    calls = _counting(ops, monkeypatch)
    got = ops.extend_attention(q, kc, vc, table, cu, lens, 0.125, window=window)
    assert calls and not got.isnan().any()
    want = torch.cat(
        [
            _dense_oracle(q[int(cu[i]) : int(cu[i + 1])], k, v, n, window)
            for i, ((k, v), n) in enumerate(zip(dense, seq_lens))
        ]
    )
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def _dense_oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int, window: int) -> torch.Tensor:
    """q [Lq, Hq, D] at positions n - Lq.., over dense k/v [n, Hkv, D], in float64 with an explicit band."""
    lq, hq, d = q.shape
    hkv = k.shape[1]
    qi = torch.arange(lq)[:, None] + n - lq
    ki = torch.arange(n)[None, :]
    seen = (ki <= qi) & (ki > qi - window)
    kk = k.double().repeat_interleave(hq // hkv, dim=1)
    vv = v.double().repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) * 0.125
    p = s.masked_fill(~seen, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", p, vv).float()


def test_f32_kernel_reads_strided_query_rows(ops) -> None:
    """q as a view into fused qkv rows (token rows further apart than heads x head_dim)."""
    nh, nkv, d = 9, 3, 64
    q, k, v, table, cu, lens = _batch([(40, 70), (0, 9)], nh, nkv, d, dtype=torch.float32, seed=1)
    qkv = torch.cat([q.view(q.shape[0], -1), torch.zeros(q.shape[0], 2 * nkv * d)], dim=1)
    strided = qkv[:, : nh * d].view(-1, nh, d)
    assert strided.stride(0) == (nh + 2 * nkv) * d
    got = ops.extend_attention(strided, k, v, table, cu, lens, d**-0.5)
    assert torch.equal(got, ops.extend_attention(q.contiguous(), k, v, table, cu, lens, d**-0.5))


def test_f32_engine_scores_like_the_reference_backend(ops, tmp_path) -> None:
    """A whole fp32 model scoring a prompt in chunks (each chunk an extend over the cached ones): the
    cpu backend's fp32 flash kernel ran, and its logprobs equal the reference backend's to fp32 noise."""
    from kvreuse.runtime.engine.engine import Engine
    from tests.helpers import make_tiny_model

    path = make_tiny_model(tmp_path / "m", arch="qwen3", vocab=512, seed=4, head_dim=64)
    ids = [int(x) for x in torch.randint(3, 500, (700,), generator=torch.Generator().manual_seed(0))]
    scores = {}
    for backend in ("reference", "cpu"):
        e = Engine(
            model_dir=str(path), dtype="float32", device="cpu", num_pages=128, attention_backend=backend
        )
        calls = []
        if backend == "cpu":
            fused = e.runner.backend.fused
            real = fused.extend_f32
            fused.extend_f32 = lambda *a, calls=calls, real=real: calls.append(1) or real(*a)
        entries = e.prompt_logprobs(ids, top=1, chunk_size=256)
        assert (len(calls) > 0) == (backend == "cpu")  # the kernel really served the extends
        scores[backend] = torch.tensor([entry[1][0] for entry in entries[1:]])
    diff = (scores["cpu"] - scores["reference"]).abs()
    assert len(diff) == len(ids) - 1
    assert float(diff.max()) < 1e-4


def test_embedded_model_cached_turns_greedy_match_transformers(ops) -> None:
    """The embedded SmolLM2 (head_dim 64) in fp32 on the cpu backend: an append-only conversation whose
    every turn extends over the cached earlier ones (the fp32 kernel over a real prefix) generates the
    same greedy tokens as transformers' fp32 on the whole prompt."""
    from kvreuse.benchmarks.serving.ttft_multiturn import conversation_prompts
    from kvreuse.runtime.engine.engine import Engine
    from kvreuse.runtime.sampling.params import SamplingParams
    from tests.helpers import embedded_dir, load_hf

    d = embedded_dir()
    hf = load_hf(d)
    hf.generation_config.eos_token_id = None
    eng = Engine(
        model_dir=str(d), dtype="float32", device="cpu", kv_cache_memory="128M", attention_backend="cpu"
    )
    fused = eng.runner.backend.fused
    calls, real = [], fused.extend_f32
    fused.extend_f32 = lambda *a: calls.append(1) or real(*a)
    prompts = conversation_prompts(eng.tokenizer, 3, seed=2, system_tokens=300, min_new=90, max_new=140)
    for t, ids in enumerate(prompts):
        out = eng.generate([ids], SamplingParams(max_tokens=12, ignore_eos=True))[0]
        assert (
            t == 0 or out.cached_tokens >= len(prompts[t - 1]) - eng.cache.page_size
        )  # a real cached prefix
        with torch.no_grad():
            want = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert out.output_token_ids == want[0, len(ids) :].tolist(), f"turn {t + 1}"
    assert calls, "the fp32 flash kernel served the extends"
