"""MoE Gemma 4 beyond the window-model parity (``test_window_parity.py``'s ``gemma4-moe`` shape): what its
config turns on and refuses, its parameter counts, and the multimodal checkpoint's nested names."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from kvreuse.runtime.models.config import ModelConfig
from kvreuse.runtime.models.moe_config import MoEConfig
from tests.engine_drive import random_ids, tiny_engine
from tests.helpers import TOKENIZER_FILES, load_hf, make_tiny_windowed
from tests.parity import all_logits

LAYERS, EXPERTS, TOP_K, HIDDEN, WIDTH = 5, 7, 3, 44, 20  # the gemma4-moe shape


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_windowed(tmp_path_factory.mktemp("g4moe") / "m", "gemma4-moe")


def test_config_reads_the_experts_and_refuses_what_it_cannot_run(model_dir):
    c = json.loads((model_dir / "config.json").read_text())
    assert ModelConfig.from_dict(c).moe == MoEConfig(EXPERTS, TOP_K, WIDTH, True, 1, (), 0)
    # without enable_moe_block transformers builds no experts, whatever num_experts says
    assert ModelConfig.from_dict(dict(c, enable_moe_block=False)).moe is None
    # the multimodal checkpoints' "vision" is bidirectional within image tokens only: text stays causal
    assert ModelConfig.from_dict(dict(c, use_bidirectional_attention="vision")) == ModelConfig.from_dict(c)
    bad = [
        (dict(num_experts=None), "needs num_experts and moe_intermediate_size"),
        (dict(moe_intermediate_size=0), "needs num_experts and moe_intermediate_size"),
        (dict(top_k_experts=8), "top_k_experts=8 must be between 1 and num_experts=7"),
        (dict(top_k_experts=None), "top_k_experts=None"),
        (dict(use_bidirectional_attention="all"), "not a causal text model"),
    ]
    for change, match in bad:
        with pytest.raises(ValueError, match=match):
            ModelConfig.from_dict(dict(c, **change))


def test_parameter_counts_match_transformers(model_dir):
    """Total: transformers' parameters (plus its layer scalars, buffers there); active: minus the
    experts a token skips."""
    hf = load_hf(model_dir)
    counts = tiny_engine(model_dir, page_size=4).runner.model.parameter_counts()
    total = sum(p.numel() for p in hf.parameters()) + LAYERS
    assert counts.total == total
    assert counts.moe_layers == LAYERS
    assert counts.expert_shapes == ((EXPERTS, 2 * WIDTH, HIDDEN), (EXPERTS, HIDDEN, WIDTH))
    assert counts.active == total - LAYERS * (EXPERTS - TOP_K) * 3 * HIDDEN * WIDTH


def test_multimodal_checkpoint_loads_the_same(model_dir, tmp_path):
    """A ``gemma4`` checkpoint nests the text config and ``model.language_model.`` weights (routers and
    experts too) beside a vision tower, which is skipped."""
    text = json.loads((model_dir / "config.json").read_text())
    nested = {"model_type": "gemma4", "tie_word_embeddings": text["tie_word_embeddings"], "text_config": text}
    (tmp_path / "config.json").write_text(json.dumps(nested))
    for f in TOKENIZER_FILES:
        shutil.copy(model_dir / f, tmp_path / f)
    state = {
        k.replace("model.", "model.language_model.", 1): v
        for k, v in load_file(model_dir / "model.safetensors").items()
    }
    assert any(".router.proj." in k for k in state) and any(".experts.gate_up_proj" in k for k in state)
    state["model.vision_tower.patch_embedder.weight"] = torch.zeros(2, 2)
    save_file(state, str(tmp_path / "model.safetensors"))
    assert ModelConfig.from_dir(tmp_path).moe == ModelConfig.from_dir(model_dir).moe
    ids = random_ids(torch.Generator().manual_seed(4), 23)
    ref = all_logits(tiny_engine(model_dir, page_size=4), ids)
    assert torch.equal(all_logits(tiny_engine(tmp_path, page_size=4), ids), ref)
