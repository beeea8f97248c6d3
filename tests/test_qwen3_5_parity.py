"""Our hybrid (Qwen3.5) model against transformers' Qwen3_5ForCausalLM on tiny random configs.

Logits within 1e-4 (fp32) at lengths 1-300, greedy generation identical to ``generate``, chunked
prefill (chunk sizes that split the conv window and the 64-token delta-rule chunks) identical to
unchunked, batched identical to alone, and echoed prompt logprobs equal to transformers'.
"""

from __future__ import annotations

import pytest
import torch

from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.sampling.params import SamplingParams
from tests.engine_drive import tiny_engine
from tests.helpers import HYBRID_SHAPES as SHAPES
from tests.helpers import load_hf, make_tiny_hybrid, make_tiny_model
from tests.parity import (
    all_logits,
    assert_greedy_matches_generate,
    assert_prompt_logprobs_match,
    hf_greedy_mismatch,
)

LENGTHS = [1, 2, 3, 7, 64, 65, 129, 300]


@pytest.fixture(scope="module")
def hybrid_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3_5")
    return {name: make_tiny_hybrid(root / name, name) for name in SHAPES}


def _engine(d, **kw) -> Engine:
    return tiny_engine(d, **{"num_pages": 256, "page_size": 4, **kw})


_all_logits = all_logits  # the name the MoE hybrid tests import


@pytest.mark.parametrize("shape", SHAPES)
def test_logits_match_transformers(hybrid_models, shape):
    check_logits_match(hybrid_models[shape], shape)


def check_logits_match(d, shape: str) -> None:
    """Every position's logits of one prefill against transformers' forward, at each of ``LENGTHS``."""
    hf = load_hf(d)
    eng = _engine(d, num_pages=128, page_size=16)
    g = torch.Generator().manual_seed(1)
    for n in LENGTHS:
        ids = torch.randint(3, 512, (n,), generator=g).tolist()
        ours = _all_logits(eng, ids)
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        assert ref.abs().max() > 0.5  # the tolerance is relative to O(1) logits
        err = (ours - ref).abs().max().item()
        assert err < 1e-4, f"{shape} len={n}: max abs err {err}"
    eng.cache.check_integrity()


def _prompts(seed: int, lengths=(5, 77, 150)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 512, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("shape", SHAPES)
def test_greedy_matches_generate(hybrid_models, shape):
    check_greedy_matches_generate(hybrid_models[shape])


def check_greedy_matches_generate(d) -> None:
    """Batched greedy decode over chunked prefill, token-identical to transformers' greedy."""
    assert_greedy_matches_generate(_engine(d, chunk_size=64), load_hf(d), _prompts(2))


@pytest.mark.parametrize("shape", SHAPES)
def test_chunked_prefill_identical_to_unchunked(hybrid_models, shape):
    check_chunked_identical_to_unchunked(hybrid_models[shape])


def check_chunked_identical_to_unchunked(d) -> None:
    """Chunk sizes 1, 2, 3, 5 split the conv window (K-1 = 2-3 inputs) at every offset; 63/65 split the
    delta rule's 64-token chunks.  Same logits (1e-5) and the same greedy tokens."""
    prompt = _prompts(3, (130,))[0]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    base = _engine(d, chunk_size=4096, record_logits=True, prefix_cache="off")
    ref = base.generate([prompt], params)[0]
    ref_req_logits = _first_logits(base, prompt)
    for chunk in (1, 2, 3, 5, 63, 65):
        eng = _engine(d, chunk_size=chunk, prefix_cache="off", record_logits=True)
        out = eng.generate([prompt], params)[0]
        assert out.output_token_ids == ref.output_token_ids, f"chunk_size={chunk}"
        err = (_first_logits(eng, prompt) - ref_req_logits).abs().max().item()
        assert err < 1e-5, f"chunk_size={chunk}: first-token logits differ by {err}"
        eng.cache.check_integrity()


def _first_logits(eng: Engine, prompt: list[int]) -> torch.Tensor:
    req = eng.make_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    eng.submit(req)
    while eng.has_work():
        eng.step()
    return req.logits_trace[0]


@pytest.mark.parametrize("shape", ["gqa-3to1-untied", "odd-heads-1to1-tied"])
def test_batched_identical_to_alone(hybrid_models, shape):
    check_batched_identical_to_alone(hybrid_models[shape])


def check_batched_identical_to_alone(d) -> None:
    """Five streams of mixed lengths prefilled and decoded together == each alone."""
    prompts = _prompts(4, (3, 40, 97, 150, 9))
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    alone = [_engine(d, prefix_cache="off").generate([p], params)[0].output_token_ids for p in prompts]
    eng = _engine(d, chunk_size=50, prefix_cache="off")
    together = [o.output_token_ids for o in eng.generate(prompts, params)]
    assert together == alone
    eng.cache.check_integrity()


def test_qwen3_next_dense_layers_match_transformers(tmp_path):
    """Qwen3-Next shares the blocks; its checkpoints group q/k/v/z (and b/a) per key head, regrouped at load.
    Dense layers only (``num_experts=0``); its sparse MoE layers: ``tests/test_moe_hybrid_parity.py``."""
    d = make_tiny_model(
        tmp_path / "next", "qwen3_next", False, initializer_range=0.1, num_experts=0, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=6, linear_key_head_dim=8, linear_value_head_dim=4,
    )  # fmt: skip
    hf = load_hf(d)
    eng = _engine(d, num_pages=64, page_size=16)
    g = torch.Generator().manual_seed(5)
    for n in (1, 9, 70, 200):
        ids = torch.randint(3, 512, (n,), generator=g).tolist()
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        err = (_all_logits(eng, ids) - ref).abs().max().item()
        assert err < 1e-4, f"len={n}: max abs err {err}"
    ids = torch.randint(3, 512, (40,), generator=g).tolist()
    out = eng.generate([ids], SamplingParams(max_tokens=32, ignore_eos=True))[0]
    assert len(out.output_token_ids) == 32 and hf_greedy_mismatch(hf, ids, out.output_token_ids) is None


def test_echo_prompt_logprobs_match_transformers(hybrid_models):
    """Scored chunk by chunk on a borrowed state slot, from a zero state: transformers' log-softmax."""
    d = hybrid_models["odd-heads-1to1-tied"]
    eng = _engine(d)
    ids = torch.randint(3, 512, (150,), generator=torch.Generator().manual_seed(7)).tolist()
    assert_prompt_logprobs_match(eng, load_hf(d), ids, chunk_size=37)
    pool = eng.runner.state_pool
    assert pool is not None and pool.num_free == pool.num_slots
