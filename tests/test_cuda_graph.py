"""Decode through the CUDA-graph runner's padded static buffers equals a plain decode forward.

Without CUDA nothing is captured: the runner's eager mode runs the very forward a graph would record
(same buffers, same padding), on the Triton kernels under the interpreter.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first `import triton`

pytest.importorskip("triton")

from kvreuse.runtime.engine.engine import Engine  # noqa: E402
from kvreuse.runtime.runner.cuda_graph import DecodeGraphRunner  # noqa: E402
from kvreuse.runtime.runner.forward_batch import build_forward_batch  # noqa: E402
from kvreuse.runtime.sampling.params import SamplingParams  # noqa: E402
from tests.helpers import make_tiny_model  # noqa: E402

PAGE_SIZE = 4


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    d = make_tiny_model(tmp_path_factory.mktemp("graph") / "m", "qwen3")
    return Engine(
        model_dir=str(d), dtype="float32", device="cpu", attention_backend="triton",
        page_size=PAGE_SIZE, num_pages=64, chunk_size=64,
    )  # fmt: skip


def _decode_batch(eng: Engine, lengths: list[int]):
    """Prefill prompts of ``lengths`` and return the next all-decode batch (pages reserved)."""
    g = torch.Generator().manual_seed(sum(lengths))
    reqs = [
        eng.make_request(torch.randint(3, 512, (n,), generator=g).tolist(), SamplingParams(max_tokens=4))
        for n in lengths
    ]
    for r in reqs:
        eng.submit(r)
    while any(not r.output_ids for r in reqs):
        eng.step()
    for r in reqs:
        assert eng.cache.reserve(r, 1)
    chunks = [(r.tokens[-1:], r.num_computed, r.pages) for r in reqs]
    return build_forward_batch(chunks, [True] * len(reqs), PAGE_SIZE, eng.device)


def _pool_snapshot(eng: Engine) -> list[torch.Tensor]:
    return [t.clone() for kv in eng.runner.pool.layers for t in kv]


def test_padded_static_decode_equals_plain_decode(engine):
    eng = engine
    runner = DecodeGraphRunner(eng.runner.model, eng.runner.pool.layers, eng.runner.backend, 16, (1, 2, 4, 8))
    fb = _decode_batch(eng, [5, 9, 14])  # 3 rows padded to 4; page-table width 4 of 16
    assert runner.can_run(fb) and runner.padded_size(3) == 4
    expected = eng.runner.model(fb, eng.runner.pool.layers, eng.runner.backend)
    before = _pool_snapshot(eng)
    got = runner.run(fb)
    assert got.shape == expected.shape == (3, 512)
    assert (got - expected).abs().max().item() < 1e-4
    # the real rows rewrite their own slots (same values); the padding row writes nowhere
    real = set(fb.slot_mapping.tolist())
    for old, new in zip(before, _pool_snapshot(eng)):
        flat_old, flat_new = old.view(-1, *old.shape[2:]), new.view(-1, *new.shape[2:])
        others = torch.tensor([s for s in range(flat_old.shape[0]) if s not in real])
        assert torch.equal(flat_old[others], flat_new[others])
        assert torch.allclose(flat_old[sorted(real)], flat_new[sorted(real)], atol=1e-5)


def test_rejects_what_a_graph_cannot_hold(engine):
    eng = engine
    runner = DecodeGraphRunner(eng.runner.model, eng.runner.pool.layers, eng.runner.backend, 2, (1, 2))
    fb = _decode_batch(eng, [3, 6, 7])
    assert not runner.can_run(fb)  # 3 rows > the largest captured size 2
    prefill = build_forward_batch([([5, 6, 7], 0, [0])], [True], PAGE_SIZE, eng.device)
    assert not runner.can_run(prefill)
    with pytest.raises(ValueError):
        runner.run(prefill)
    with pytest.raises(ValueError, match="triton"):
        DecodeGraphRunner(
            eng.runner.model, eng.runner.pool.layers, eng.runner.backend._replace(name="reference"), 2
        )
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            DecodeGraphRunner(eng.runner.model, eng.runner.pool.layers, eng.runner.backend, 2, capture=True)


def test_engine_decodes_through_the_graph_runner(tmp_path_factory):
    """Wired into the model runner: an engine whose decode steps go through the padded static buffers
    (eager here; replayed graphs on a GPU) generates exactly the tokens of the plain engine."""
    d = make_tiny_model(tmp_path_factory.mktemp("graph-engine") / "m", "qwen3")
    opts = dict(
        model_dir=str(d), dtype="float32", device="cpu", attention_backend="triton", page_size=PAGE_SIZE
    )
    plain, graphed = Engine(**opts, num_pages=64), Engine(**opts, num_pages=64)
    graphed.runner.enable_decode_graphs(graphed.max_model_len, capture=False)
    runs = []
    inner = graphed.runner.graphs.run
    graphed.runner.graphs.run = lambda fb: runs.append(fb.input_ids.shape[0]) or inner(fb)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (3, 9, 17)]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    want = [o.output_token_ids for o in plain.generate(prompts, params)]
    got = [o.output_token_ids for o in graphed.generate(prompts, params)]
    assert got == want
    assert runs and max(runs) == 3  # the decode steps of all three streams went through the buffers
