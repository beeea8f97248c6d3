"""Qwen3-MoE against transformers' ``Qwen3MoeForCausalLM``, and the engine's equivalences on MoE models.

Two tiny random configs cover the routing options: renormalised top-2 of 8 with a dense layer in
``mlp_only_layers``; raw top-3 of 6 probabilities, every second layer sparse, tied embeddings.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.models.config import ModelConfig
from kvreuse.runtime.models.moe import SparseMoE
from kvreuse.runtime.models.weights import WeightsError, load_weights
from tests.engine_drive import (
    alone,
    assert_logits_close,
    assert_no_request_pages,
    generate_checked,
    greedy,
    random_ids,
    tiny_engine,
)
from tests.helpers import load_hf, make_tiny_model
from tests.parity import assert_greedy_matches_generate
from tests.test_model_parity import LENGTHS, _our_all_logits

CONFIGS = {
    "top2-norm": dict(
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
        num_hidden_layers=3, mlp_only_layers=[1],
    ),
    "top3-raw-step2-tied": dict(
        num_experts=6, num_experts_per_tok=3, moe_intermediate_size=24, norm_topk_prob=False,
        num_hidden_layers=4, decoder_sparse_step=2, tie=True,
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("moe")
    return {k: make_tiny_model(root / k, "qwen3_moe", **kw) for k, kw in CONFIGS.items()}


def test_sparse_layers_follow_the_config(moe_models):
    eng = tiny_engine(moe_models["top2-norm"])
    kinds = [isinstance(layer.mlp, SparseMoE) for layer in eng.runner.model.layers]
    assert kinds == [True, False, True]  # mlp_only_layers=[1]
    eng = tiny_engine(moe_models["top3-raw-step2-tied"])
    kinds = [isinstance(layer.mlp, SparseMoE) for layer in eng.runner.model.layers]
    assert kinds == [False, True, False, True]  # decoder_sparse_step=2


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_match_transformers(moe_models, name):
    hf = load_hf(moe_models[name])
    eng = Engine(model_dir=str(moe_models[name]), dtype="float32", device="cpu", num_pages=64, page_size=16)
    g = torch.Generator().manual_seed(1)
    for n in LENGTHS:
        ids = torch.randint(3, 512, (n,), generator=g).tolist()
        ours = _our_all_logits(eng, ids)
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        err = (ours - ref).abs().max().item()
        assert err < 1e-4, f"{name} len={n}: max abs err {err}"
    eng.cache.check_integrity()


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_generation_matches_generate(moe_models, name):
    eng = tiny_engine(moe_models[name], num_pages=128, page_size=4, chunk_size=64)
    g = torch.Generator().manual_seed(2)
    assert_greedy_matches_generate(eng, load_hf(moe_models[name]), [random_ids(g, n) for n in (5, 77, 150)])


def test_batched_chunked_and_cached_runs_equal_alone(moe_models):
    check_batched_chunked_cached_equal_alone(moe_models["top2-norm"], min_cached=32)


def check_batched_chunked_cached_equal_alone(d, min_cached: int) -> None:
    """Eight streams decoding together (experts shared across rows) == each alone, chunked == not, cache == off.

    ``min_cached``: prompt tokens the warmed radix cache must serve to each of the eight requests.
    """
    g = torch.Generator().manual_seed(3)
    base = random_ids(g, 40)
    prompts = [base + random_ids(g, 3 + 11 * i) for i in range(8)]  # shared prefix for the radix cache
    params = [greedy(12) for _ in prompts]
    kw = dict(num_pages=256, record_logits=True)
    batched = generate_checked(tiny_engine(d, chunk_size=256, **kw), prompts, params)
    chunked = generate_checked(tiny_engine(d, chunk_size=7, page_size=4, **kw), prompts, params)
    cached_eng = tiny_engine(d, chunk_size=32, **kw)
    generate_checked(cached_eng, prompts[:2], params[:2])  # warm the tree with the shared prefix
    cached = generate_checked(cached_eng, prompts, params)
    assert all(r.cached_tokens >= min_cached for r in cached)
    assert_no_request_pages(cached_eng)
    solo = tiny_engine(d, prefix_cache="off", num_pages=64, record_logits=True)
    for i, p in enumerate(prompts):
        (one,) = generate_checked(solo, [p], [params[i]])
        for other in (batched[i], chunked[i], cached[i]):
            assert other.output_ids == one.output_ids == alone(solo, p, params[i])
            assert_logits_close(other, one)


def test_fused_expert_checkpoint_loads_the_same(moe_models, tmp_path):
    """transformers' in-memory layout (``experts.gate_up_proj [E, 2I, H]``) saved as-is loads too."""
    d = moe_models["top2-norm"]
    hf = load_hf(d)
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in state)
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((d / "config.json").read_text())
    ids = random_ids(torch.Generator().manual_seed(4), 33)
    ours = [_our_all_logits(tiny_engine(x), ids) for x in (d, tmp_path)]
    assert torch.equal(ours[0], ours[1])


def test_expert_weight_errors_are_clear(moe_models, tmp_path):
    from kvreuse.runtime.models import build_model

    d = moe_models["top2-norm"]
    cfg = ModelConfig.from_dir(d)
    hf = load_hf(d)
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    name = next(k for k in state if k.endswith("mlp.experts.gate_up_proj"))
    state[name.replace("gate_up_proj", "9.gate_proj.weight")] = torch.zeros(32, 64)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightsError, match="expert 9 out of range"):
        load_weights(build_model(cfg, torch.device("cpu")), tmp_path)


def test_parameter_counts_match_transformers(moe_models):
    """Total from transformers' own parameters; active = total minus the experts a token skips."""
    for name, kw in CONFIGS.items():
        hf = load_hf(moe_models[name])
        counts = tiny_engine(moe_models[name]).runner.model.parameter_counts()
        assert counts.total == sum(p.numel() for p in hf.parameters())
        moe_layers = sum(1 for layer in hf.model.layers if hasattr(layer.mlp, "experts"))
        per_expert = 3 * 64 * kw["moe_intermediate_size"]  # hidden 64
        skipped = moe_layers * (kw["num_experts"] - kw["num_experts_per_tok"]) * per_expert
        assert counts.active == counts.total - skipped
        assert counts.moe_layers == moe_layers and counts.total_bytes == 4 * counts.total


def test_qwen3_30b_a3b_shape_counts_30b_total_3b_active():
    """The real model's config on the meta device (no memory): transformers' count, and the A3B in its name."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from kvreuse.runtime.models.decoder import CausalLM

    c = dict(
        model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
        moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
        head_dim=128, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, tie_word_embeddings=False,
    )  # fmt: skip
    with torch.device("meta"):
        counts = CausalLM(ModelConfig.from_dict(c)).to(torch.bfloat16).parameter_counts()
        hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**c))
    assert counts.total == sum(p.numel() for p in hf.parameters())
    assert 30.4e9 < counts.total < 30.6e9 and 3.3e9 < counts.active < 3.4e9
    assert counts.expert_shapes == ((128, 1536, 2048), (128, 2048, 768)) and counts.moe_layers == 48
    assert counts.active_bytes == 2 * counts.active
