"""Sliding-window models (Gemma 3, Gemma 4 dense and MoE, Mistral, Ministral) against transformers, fp32.

Logits within 1e-4 at lengths below, at, just past and 3x+ the window; greedy 64 tokens identical to
``generate``; chunked prefill == unchunked across the window boundary; batched == alone; a multi-turn
session with the prefix cache == without it.  Both CPU backends (``reference``; ``cpu``: the C
decode kernel with its window).
"""

from __future__ import annotations

import pytest
import torch

from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.sampling.params import SamplingParams
from tests.engine_drive import random_ids, tiny_engine
from tests.helpers import WINDOW_SHAPES, load_hf, make_tiny_windowed, window_of
from tests.parity import (
    assert_greedy_matches_generate,
    assert_logits_match,
    assert_prompt_logprobs_match,
    assert_session_cached_equals_uncached,
    first_logits,
)

SHAPES = list(WINDOW_SHAPES)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("win")
    return {s: make_tiny_windowed(root / s, s) for s in SHAPES}


def _engine(d, **kw) -> Engine:
    return tiny_engine(d, **{"page_size": 4, "num_pages": 256, **kw})


# the C kernels on the Gemma shape, the reference on every shape
CASES = [(s, "reference") for s in SHAPES] + [
    ("gemma3-odd", "cpu"),
    ("gemma4-odd", "cpu"),
    ("mistral", "cpu"),
]


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("shape", SHAPES)
def test_logits_match_transformers(models, shape, backend):
    w = window_of(shape)
    eng = _engine(models[shape], attention_backend=backend)
    lengths = [1, w - 1, w, w + 1, 3 * w, 3 * w + 5, 101]
    assert_logits_match(eng, load_hf(models[shape]), lengths, label=f"{shape} {backend}", min_scale=0.5)


@pytest.mark.parametrize("shape,backend", CASES)
def test_greedy_64_matches_generate(models, shape, backend):
    w = window_of(shape)
    eng = _engine(models[shape], chunk_size=16, attention_backend=backend)
    gen = torch.Generator().manual_seed(2)
    prompts = [random_ids(gen, n) for n in (5, 3 * w + 2)]
    assert_greedy_matches_generate(eng, load_hf(models[shape]), prompts, max_new=64)


@pytest.mark.parametrize("shape", ["gemma3-odd", "gemma4-odd", "gemma4-moe", "mistral"])
def test_chunked_prefill_identical_to_unchunked(models, shape):
    """Chunks of 1, 3, W - 1, W + 1 put chunk boundaries at every offset of the window."""
    w = window_of(shape)
    # fp32 summation order differs between chunkings; Gemma 4's seven layers with per-layer-input
    # branches and layer scalars up to 1.5 carry it a little further than the other shapes' 1e-5
    tol = 3e-5 if shape.startswith("gemma4") else 1e-5
    prompt = random_ids(torch.Generator().manual_seed(3), 4 * w + 3)
    ref_ids, ref_logits = first_logits(_engine(models[shape], record_logits=True, prefix_cache="off"), prompt)
    for chunk in (1, 3, w - 1, w + 1):
        eng = _engine(models[shape], chunk_size=chunk, record_logits=True, prefix_cache="off")
        ids, logits = first_logits(eng, prompt)
        assert ids == ref_ids, f"chunk_size={chunk}"
        assert (logits - ref_logits).abs().max().item() < tol, f"chunk_size={chunk}"
        eng.cache.check_integrity()


# gemma4-moe: its experts run per row (embedding_bag) up to 4 rows and as grouped GEMMs over a batch
@pytest.mark.parametrize("shape", ["gemma3-odd", "gemma4-odd", "gemma4-moe", "ministral"])
def test_batched_identical_to_alone(models, shape):
    gen = torch.Generator().manual_seed(4)
    prompts = [random_ids(gen, n) for n in (3, 40, 97, 9, 25)]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    alone = [_engine(models[shape]).generate([p], params)[0].output_token_ids for p in prompts]
    eng = _engine(models[shape], chunk_size=50)
    assert [o.output_token_ids for o in eng.generate(prompts, params)] == alone
    eng.cache.check_integrity()


@pytest.mark.parametrize("shape", SHAPES)
def test_multi_turn_session_cached_equals_uncached(models, shape):
    """Each turn's prompt is the previous prompt + its output + new tokens, far past the window."""
    on, off = _engine(models[shape], chunk_size=32), _engine(models[shape], chunk_size=32, prefix_cache="off")
    assert_session_cached_equals_uncached(on, off, turns=6)


@pytest.mark.parametrize("shape", ["gemma3-odd", "gemma4-odd", "ministral"])
def test_echo_prompt_logprobs_match_transformers(models, shape):
    """Scoring a prompt 3x the window in chunks that cross it, on a borrowed ring slot (the rings'
    slots are all free again after), equals transformers' log-softmax."""
    w = window_of(shape)
    eng = _engine(models[shape], chunk_size=w + 2)
    ids = random_ids(torch.Generator().manual_seed(6), 3 * w + 5)
    assert_prompt_logprobs_match(eng, load_hf(models[shape]), ids, chunk_size=w - 1)
    pool = eng.runner.state_pool
    assert pool is None or pool.num_free == pool.num_slots
