"""The MoE hybrids against transformers: ``Qwen3_5MoeForCausalLM`` (text) and ``Qwen3NextForCausalLM``.

Gated DeltaNet + gated attention layers with sparse MoE blocks (router, routed experts, a shared
expert behind a sigmoid gate).  The checks are the dense hybrids' and Qwen3-MoE's, shared, not
copied: logits within 1e-4 (fp32) at lengths 1-300, greedy 64 == ``generate``, chunked ==
unchunked, batched == alone, with the prefix cache == without.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from kvreuse.runtime.models.config import ModelConfig
from kvreuse.runtime.models.moe import SparseMoE
from tests.engine_drive import random_ids, tiny_engine
from tests.helpers import load_hf, make_tiny_model
from tests.test_moe_parity import check_batched_chunked_cached_equal_alone
from tests.test_qwen3_5_parity import (
    _all_logits,
    check_batched_identical_to_alone,
    check_chunked_identical_to_unchunked,
    check_greedy_matches_generate,
    check_logits_match,
)

# init 0.05, not the dense hybrids' 0.1: with the 25x sharpened router (tests/helpers.py) 0.1 makes
# these models so sensitive that transformers' own fp32 logits differ from its fp64 ones by up to 8e-4
# at 300 tokens, above the tolerance; at 0.05 logits stay O(1) and that floor is ~1e-6
_HYBRID = dict(
    initializer_range=0.05, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
)  # fmt: skip
# arch, tied, overrides: Qwen3.5-MoE is sparse everywhere and always renormalises; Qwen3-Next here
# uses raw top-k probabilities and keeps a dense layer (mlp_only_layers) beside its sparse ones
CONFIGS = {
    "qwen3_5_moe-top2-norm": (
        "qwen3_5_moe_text", False,
        dict(num_hidden_layers=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
             shared_expert_intermediate_size=24),
    ),
    "qwen3_next-top3-raw-tied": (
        "qwen3_next", True,
        dict(num_hidden_layers=5, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=12,
             shared_expert_intermediate_size=20, norm_topk_prob=False, mlp_only_layers=[2],
             layer_types=["linear_attention", "full_attention"] * 2 + ["linear_attention"]),
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("moe_hybrid")
    return {
        k: make_tiny_model(root / k, arch, tie, **_HYBRID, **kw) for k, (arch, tie, kw) in CONFIGS.items()
    }


def test_sparse_layers_and_parameter_counts_follow_transformers(models):
    for name, d in models.items():
        hf = load_hf(d)
        model = tiny_engine(d).runner.model
        ours = [isinstance(layer.mlp, SparseMoE) for layer in model.layers]
        assert ours == [hasattr(layer.mlp, "experts") for layer in hf.model.layers], name
        counts = model.parameter_counts()
        assert counts.total == sum(p.numel() for p in hf.parameters())
        kw = CONFIGS[name][2]
        skipped = (
            sum(ours) * (kw["num_experts"] - kw["num_experts_per_tok"]) * 3 * 64 * kw["moe_intermediate_size"]
        )
        assert counts.active == counts.total - skipped and counts.moe_layers == sum(ours)
    assert ours == [True, True, False, True, True]  # qwen3_next: mlp_only_layers=[2]


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_match_transformers(models, name):
    check_logits_match(models[name], name)


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_matches_generate(models, name):
    check_greedy_matches_generate(models[name])


@pytest.mark.parametrize("name", CONFIGS)
def test_chunked_prefill_identical_to_unchunked(models, name):
    check_chunked_identical_to_unchunked(models[name])


@pytest.mark.parametrize("name", CONFIGS)
def test_batched_identical_to_alone(models, name):
    check_batched_identical_to_alone(models[name])


@pytest.mark.parametrize("name", CONFIGS)
def test_batched_chunked_and_cached_runs_equal_alone(models, name):
    # a hybrid reuses a prefix only up to its last linear-attention state snapshot (a page boundary)
    check_batched_chunked_cached_equal_alone(models[name], min_cached=16)


def test_multimodal_checkpoint_and_fused_experts_load_the_same(models, tmp_path):
    """A ``qwen3_5_moe`` checkpoint nests the text config and ``model.language_model.`` weights; experts
    stored fused (``experts.gate_up_proj [E, 2I, H]``, transformers' in-memory layout) load too."""
    d = models["qwen3_5_moe-top2-norm"]
    text = json.loads((d / "config.json").read_text())
    nested = {"model_type": "qwen3_5_moe", "tie_word_embeddings": False, "text_config": text}
    (tmp_path / "config.json").write_text(json.dumps(nested))
    state = {
        k.replace("model.", "model.language_model.", 1): v
        for k, v in load_file(d / "model.safetensors").items()
    }
    state["model.visual.patch_embed.proj.weight"] = torch.zeros(2, 2)  # the vision tower is skipped
    save_file(state, str(tmp_path / "model.safetensors"))
    fused = tmp_path / "fused"
    fused.mkdir()
    (fused / "config.json").write_text((d / "config.json").read_text())
    save_file(
        {k: v.contiguous() for k, v in load_hf(d).state_dict().items()}, str(fused / "model.safetensors")
    )
    assert ModelConfig.from_dir(tmp_path).moe == ModelConfig.from_dir(d).moe
    ids = random_ids(torch.Generator().manual_seed(4), 33)
    ref = _all_logits(tiny_engine(d), ids)
    for other in (tmp_path, fused):
        assert torch.equal(_all_logits(tiny_engine(other), ids), ref)


def test_tensor_parallel_refuses_the_moe_hybrids(models):
    from kvreuse.runtime.runner.distributed.sharding import local_config

    for d in models.values():
        with pytest.raises(ValueError, match="mixture-of-experts"):
            local_config(ModelConfig.from_dir(d), 2)
