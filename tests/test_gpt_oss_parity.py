"""gpt-oss against transformers' GptOssForCausalLM, fp32, on tiny random configs of odd shape.

Sinks of O(1) (``make_tiny_model`` scales them), alternating sliding/full layers with windows that are
not multiples of the page size, YaRN rope (truncated and not), odd head groups, biased router and
experts with the clamped SwiGLU.  Logits within 1e-4 at lengths below, at and beyond the window; greedy
64 tokens identical to ``generate``; chunked == unchunked; batched == alone; a multi-turn session with
the prefix cache == without it.  Both CPU backends: the ``reference`` one's torch sinks and the ``cpu``
one's C decode kernel with sinks (each kernel alone: ``tests/test_sink_kernels.py``).
"""

from __future__ import annotations

import pytest
import torch

from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.models.config import ModelConfig
from kvreuse.runtime.sampling.params import SamplingParams
from tests.engine_drive import alone, random_ids, tiny_engine
from tests.helpers import load_hf, make_tiny_model
from tests.parity import (
    assert_greedy_matches_generate,
    assert_logits_match,
    assert_session_cached_equals_uncached,
    first_logits,
)

SHAPES = {
    # 3 query heads per KV head, 5 experts top-2, window 7, YaRN untruncated (gpt-oss's own setting)
    "odd": dict(
        hidden_size=48, intermediate_size=40, num_hidden_layers=3, num_attention_heads=6,
        num_key_value_heads=2, head_dim=16, num_local_experts=5, num_experts_per_tok=2, sliding_window=7,
        rope_parameters={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False, "original_max_position_embeddings": 64, "rope_theta": 150000.0},
    ),
    # no GQA, explicit layer_types (full first), 7 experts top-3, window 5, YaRN truncated, tied head
    "mha": dict(
        tie=True, hidden_size=40, intermediate_size=24, num_hidden_layers=4, num_attention_heads=3,
        num_key_value_heads=3, head_dim=8, num_local_experts=7, num_experts_per_tok=3, sliding_window=5,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        swiglu_limit=2.0,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                         "rope_theta": 10000.0},
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt_oss")
    out = {}
    for name, kw in SHAPES.items():
        kw = dict(kw)
        tie = kw.pop("tie", False)
        out[name] = make_tiny_model(root / name, "gpt_oss", tie, initializer_range=0.1, **kw)
    return out


def _window(shape: str) -> int:
    return SHAPES[shape]["sliding_window"]


def _engine(d, **kw) -> Engine:
    return tiny_engine(d, **{"page_size": 4, "num_pages": 256, **kw})


def test_config_reads_windows_experts_and_yarn(models):
    cfg = ModelConfig.from_dir(models["odd"])
    assert cfg.windows == (7, None, 7)
    assert cfg.moe is not None and (cfg.moe.num_experts, cfg.moe.top_k) == (5, 2)
    assert cfg.moe.expert_intermediate_size == 40 and cfg.moe.norm_topk_prob
    assert cfg.rope_scaling is not None and cfg.rope_scaling["rope_type"] == "yarn"
    assert cfg.qkv_bias and cfg.gpt_oss is not None and cfg.gpt_oss.swiglu_limit == 7.0
    assert not cfg.gpt_oss.mxfp4


@pytest.mark.parametrize("shape,backend", [("odd", "reference"), ("odd", "cpu"), ("mha", "reference")])
def test_logits_match_transformers(models, shape, backend):
    w = _window(shape)
    eng = _engine(models[shape], attention_backend=backend)
    lengths = [1, w - 1, w, w + 1, 3 * w + 5, 101]
    assert_logits_match(eng, load_hf(models[shape]), lengths, label=f"{shape} {backend}", min_scale=0.5)


@pytest.mark.parametrize("shape,backend", [("odd", "cpu"), ("mha", "reference")])
def test_greedy_64_matches_generate(models, shape, backend):
    w = _window(shape)
    eng = _engine(models[shape], chunk_size=16, attention_backend=backend)
    gen = torch.Generator().manual_seed(2)
    prompts = [random_ids(gen, n) for n in (5, 3 * w + 2)]
    assert_greedy_matches_generate(eng, load_hf(models[shape]), prompts, max_new=64)


@pytest.mark.parametrize("shape,chunks", [("odd", (3, 8)), ("mha", (1, 4))])
def test_chunked_prefill_identical_to_unchunked(models, shape, chunks):
    """Chunks of 1, 3, W - 1, W + 1 (between the two shapes) put chunk boundaries at every offset of
    the window."""
    w = _window(shape)
    prompt = random_ids(torch.Generator().manual_seed(3), 4 * w + 3)
    ref_ids, ref_logits = first_logits(_engine(models[shape], record_logits=True, prefix_cache="off"), prompt)
    for chunk in chunks:
        eng = _engine(models[shape], chunk_size=chunk, record_logits=True, prefix_cache="off")
        ids, logits = first_logits(eng, prompt)
        assert ids == ref_ids, f"chunk_size={chunk}"
        assert (logits - ref_logits).abs().max().item() < 1e-5, f"chunk_size={chunk}"
        eng.cache.check_integrity()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_batched_identical_to_alone(models, shape):
    """Five prompts together (decode batches of 1-5 rows: both expert paths) == each alone."""
    gen = torch.Generator().manual_seed(4)
    prompts = [random_ids(gen, n) for n in (3, 40, 97, 9, 25)]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    single = _engine(models[shape], prefix_cache="off")
    each = [alone(single, p, params) for p in prompts]
    eng = _engine(models[shape], chunk_size=50)
    assert [o.output_token_ids for o in eng.generate(prompts, params)] == each
    eng.cache.check_integrity()


@pytest.mark.parametrize("shape", ["odd"])
def test_multi_turn_session_cached_equals_uncached(models, shape):
    """Each turn's prompt is the previous prompt + its output + new tokens, far past the window."""
    on, off = _engine(models[shape], chunk_size=32), _engine(models[shape], chunk_size=32, prefix_cache="off")
    assert_session_cached_equals_uncached(on, off, turns=5)


@pytest.mark.parametrize("truncate", [False, True])
def test_yarn_tables_match_transformers_on_the_real_config(truncate):
    """gpt-oss-20b's own rope: YaRN factor 32 over 4,096 positions, theta 150,000, head_dim 64."""
    from transformers import GptOssConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from kvreuse.runtime.models.layers import rope_attention_factor, rope_inv_freq

    hf = GptOssConfig()
    hf.rope_parameters = dict(hf.rope_parameters, rope_theta=150000.0, truncate=truncate)
    inv, factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    scaling = dict(hf.rope_parameters)
    assert torch.allclose(rope_inv_freq(64, 150000.0, scaling), inv, rtol=1e-6, atol=0)
    assert rope_attention_factor(scaling) == pytest.approx(factor, rel=1e-12)
