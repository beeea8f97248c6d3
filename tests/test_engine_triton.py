"""The whole engine on the Triton attention backend equals the torch reference backend.

Without CUDA the Triton kernels run in Triton's interpreter on CPU tensors, so the model is tiny and
the script short.  One scripted run per backend covers what the kernel tests cannot: the model runner's
flat batches, a prefix-cache hit on a page-misaligned shared prefix, chunked prefill whose chunks start
mid-page (chunk size 10, page size 4), and steps that mix a running decode with prefill chunks.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Must precede the first `import triton`: kernels are bound to the interpreter at decoration.
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from kvreuse.runtime.engine.engine import Engine  # noqa: E402
from kvreuse.runtime.request import Request  # noqa: E402
from kvreuse.runtime.sampling.params import SamplingParams  # noqa: E402
from tests.engine_drive import trace_logits  # noqa: E402
from tests.helpers import make_tiny_model  # noqa: E402

PAGE_SIZE, CHUNK_SIZE = 4, 10
LOGITS_TOL = 1e-4  # fp32 throughout; both backends accumulate in fp32


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen3") / "m", "qwen3", tie=False)


def _prompts() -> dict[str, list[int]]:
    g = torch.Generator().manual_seed(7)
    base = torch.randint(3, 512, (30,), generator=g).tolist()
    return {
        "first": base,
        # shares 22 tokens with "first": 5 whole cached pages, then a prefill starting at position 20
        "shared": base[:22] + torch.randint(3, 512, (9,), generator=g).tolist(),
        "fresh": torch.randint(3, 512, (13,), generator=g).tolist(),
        "decoding": torch.randint(3, 512, (5,), generator=g).tolist(),
    }


def _run_script(model_dir, backend: str) -> tuple[dict[str, Request], list[tuple[int, int]]]:
    """Fixed arrival script; returns the requests and, per step, (#decode chunks, #prefill chunks)."""
    eng = Engine(
        model_dir=str(model_dir), dtype="float32", device="cpu", attention_backend=backend,
        page_size=PAGE_SIZE, chunk_size=CHUNK_SIZE, num_pages=64,
    )  # fmt: skip
    trace_logits(eng)
    assert eng.runner.backend.name == backend
    prompts = _prompts()
    max_tokens = {"first": 2, "shared": 4, "fresh": 4, "decoding": 8}
    reqs = {
        n: eng.make_request(ids, SamplingParams(max_tokens=max_tokens[n], ignore_eos=True))
        for n, ids in prompts.items()
    }
    mix: list[tuple[int, int]] = []
    schedule = eng.scheduler.schedule

    def recording_schedule():
        batch = schedule()
        chunks = batch.chunks if batch is not None else []
        decodes = sum(1 for c in chunks if c.length == 1 and c.start >= c.req.num_prompt)
        mix.append((decodes, len(chunks) - decodes))
        return batch

    eng.scheduler.schedule = recording_schedule

    def run_until(done) -> None:
        while not done():
            eng.step()

    eng.submit(reqs["first"])
    run_until(lambda: reqs["first"].finish_reason is not None)
    eng.submit(reqs["decoding"])
    run_until(lambda: len(reqs["decoding"].output_ids) >= 2)
    eng.submit(reqs["shared"])
    eng.submit(reqs["fresh"])
    run_until(lambda: all(r.finish_reason is not None for r in reqs.values()))
    eng.cache.check_integrity()
    return reqs, mix


@pytest.fixture(scope="module")
def runs(qwen3_dir):
    return {b: _run_script(qwen3_dir, b) for b in ("reference", "triton")}


def test_script_exercises_cache_hits_and_mixed_batches(runs):
    reqs, mix = runs["triton"]
    assert reqs["shared"].cached_tokens == 20  # 22 shared tokens -> 5 whole pages of 4
    assert reqs["fresh"].cached_tokens == 0
    assert any(d > 0 and p > 0 for d, p in mix), f"no step mixed decode and prefill: {mix}"
    assert any(p > 1 for _, p in mix), f"no step batched two prefills: {mix}"


def test_greedy_tokens_equal_reference(runs):
    ref, triton = runs["reference"][0], runs["triton"][0]
    for name in ref:
        assert triton[name].output_ids == ref[name].output_ids, name
        assert len(ref[name].output_ids) == ref[name].params.max_tokens


def test_logits_within_fp32_tolerance(runs):
    ref, triton = runs["reference"][0], runs["triton"][0]
    for name in ref:
        a, b = torch.stack(ref[name].logits_trace), torch.stack(triton[name].logits_trace)
        assert a.shape == b.shape == (ref[name].params.max_tokens, 512)
        err = (a - b).abs().max().item()
        assert err < LOGITS_TOL, f"{name}: max abs logit diff {err}"
