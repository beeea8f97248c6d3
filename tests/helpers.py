"""Tiny random HF models saved to disk, so tests load them the way users load real ones."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import torch

from kvreuse.runtime.loading.model_source import resolve_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def metric_value(text: str, name: str, labels: str = "") -> float:
    """A sample's value in a Prometheus text exposition (``/metrics``)."""
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name}{labels} not in /metrics"
    return float(m.group(1))


def reset_cache(aengine) -> None:
    """Drop the cached pages of an engine that servers share, on its own thread: a server just closed
    may have left its re-rendered prefill's abort in the engine's queue, which runs first there (a
    reset from this thread could find that request still running)."""
    aengine.run_idle(lambda e: e.reset_prefix_cache())


def settle_background(app) -> int:
    """Wait (up to 12 s) for the server's background prefills (a re-rendered turn: a client runs its
    tools meanwhile) to finish; returns how many it has prefilled so far (0 for a server without them)."""
    background = getattr(app.state.kv, "background", None)
    for _ in range(600):
        if background is None or not background.pending:
            return background.counts["rewarm"] if background is not None else 0
        time.sleep(0.02)
    raise AssertionError("background prefill still running")


def embedded_dir() -> Path:
    return resolve_model(None)[0]


def make_tiny_model(
    out: Path, arch: str = "llama", tie: bool = False, vocab: int = 512, seed: int = 0, **overrides
) -> Path:
    """Random-initialised ``arch`` (llama, qwen2, qwen3, qwen3_moe, mistral, qwen3_5_text, ...) with GQA,
    saved as safetensors with the embedded model's tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=tie,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if arch in ("qwen3", "qwen3_moe"):
        kw["head_dim"] = 16
    kw.update(overrides)
    cfg = AutoConfig.for_model(arch, **kw)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # HF inits biases and norms to constants; randomise so they are tested
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            elif name.endswith(("mlp.gate.weight", "mlp.router.weight")):  # MoE router: decisive picks,
                p.mul_(25.0)  # no near-ties to flip
            elif name.endswith("router.proj.weight"):  # Gemma 4's (input normed to ~1): logits of std ~1,
                p.mul_(10.0)  # picks still decisive, weights not one-hot (the renormalisation tested)
            elif name.endswith(("router.scale", "router.per_expert_scale")):  # Gemma 4's (ones at init)
                p.uniform_(0.5, 1.5)
            elif name.endswith("self_attn.sinks"):  # gpt-oss: sinks of O(1), so they take real weight
                p.mul_(20.0)
        for name, b in model.named_buffers():  # Gemma 4's per-layer output scale (ones at init)
            if name.endswith("layer_scalar"):
                b.uniform_(0.5, 1.5)
    model.save_pretrained(out, safe_serialization=True)
    src = embedded_dir()
    for f in TOKENIZER_FILES:
        if (src / f).exists():
            shutil.copy(src / f, out / f)
    return out


# name -> overrides: odd head counts, key/value head ratios 1-3, linear:full 3:1, 1:1 (odd layer count)
# and 1:0 tail, partial rotary 1/4 and 1/2, conv kernels 4 and 3, tied and untied
HYBRID_SHAPES = {
    "gqa-3to1-untied": dict(
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
    ),
    "odd-heads-1to1-tied": dict(
        tie=True,
        layer_types=["linear_attention", "full_attention"] * 2 + ["linear_attention"],
        num_hidden_layers=5,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=12,
        linear_num_key_heads=3,
        linear_num_value_heads=3,
        linear_key_head_dim=12,
        linear_value_head_dim=10,
    ),
    "rep3-halfrope-k3": dict(
        num_hidden_layers=3,
        num_attention_heads=5,
        num_key_value_heads=5,
        head_dim=8,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        linear_num_key_heads=1,
        linear_num_value_heads=3,
        linear_key_head_dim=16,
        linear_value_head_dim=6,
        linear_conv_kernel_dim=3,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    ),
}


def make_tiny_hybrid(out: Path, shape: str, seed: int = 0) -> Path:
    """A tiny random Qwen3.5 text model (transformers' Qwen3_5ForCausalLM) of one of ``HYBRID_SHAPES``."""
    kw = dict(HYBRID_SHAPES[shape])
    tie = kw.pop("tie", False)
    # larger init than HF's 0.02 so logits are O(1) and a 1e-4 tolerance means something
    return make_tiny_model(out, "qwen3_5_text", tie, seed=seed, initializer_range=0.1, **kw)


def load_hf(model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


# name -> (arch, overrides): sliding-window models of odd shape.  Windows not multiples of the test
# page sizes (4, 16); Gemma's interleaving both explicit and by its default pattern; softcapping, a
# query_pre_attn_scalar that is not head_dim, a linear-scaled global rope; Mistral windows every layer
WINDOW_SHAPES = {
    "gemma3-odd": ("gemma3_text", dict(
        tie=True, num_hidden_layers=5, num_attention_heads=3, num_key_value_heads=1, head_dim=16,
        hidden_size=48, intermediate_size=80, sliding_window=7, query_pre_attn_scalar=20,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                     "full_attention"],
        final_logit_softcapping=30.0,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 50000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}},
    )),
    "gemma3-pattern": ("gemma3_text", dict(
        num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=2, head_dim=8, hidden_size=40,
        intermediate_size=72, sliding_window=12, query_pre_attn_scalar=8,
    )),
    # Gemma 4: full layers of their own head shape, k as v, fewer full KV heads, PLE, a KV-shared tail
    # (one full and one sliding layer reading earlier layers' KV) with double-wide MLPs, a proportional
    # rope on half the full head; and a plain one by the default pattern (last layer forced full)
    "gemma4-odd": ("gemma4_text", dict(
        tie=True, num_hidden_layers=7, num_attention_heads=3, num_key_value_heads=3, head_dim=16,
        global_head_dim=24, num_global_key_value_heads=1, attention_k_eq_v=True, hidden_size=48,
        intermediate_size=80, sliding_window=7, num_kv_shared_layers=2, use_double_wide_mlp=True,
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=512, final_logit_softcapping=30.0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                     "full_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                            "rope_theta": 5000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}},
    )),
    # MoE Gemma 4 (the 26B-A4B's layout: router + experts beside every layer's dense MLP, keys as values on
    # the full layers, no PLE, no KV-shared layers: transformers' forward fails on those without PLE):
    # 7 experts of width 20, top-3, a dense MLP of 36
    "gemma4-moe": ("gemma4_text", dict(
        num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2, head_dim=12, global_head_dim=20,
        num_global_key_value_heads=1, attention_k_eq_v=True, hidden_size=44, intermediate_size=36,
        sliding_window=7, hidden_size_per_layer_input=0, final_logit_softcapping=30.0,
        enable_moe_block=True, num_experts=7, top_k_experts=3, moe_intermediate_size=20,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                     "full_attention"],
    )),
    "gemma4-plain": ("gemma4_text", dict(
        num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=16,
        hidden_size=40, intermediate_size=72, sliding_window=12, hidden_size_per_layer_input=0,
    )),
    "mistral": ("mistral", dict(sliding_window=9, num_attention_heads=6, num_key_value_heads=2, hidden_size=48)),
    "ministral": ("ministral", dict(
        sliding_window=6, num_hidden_layers=3, head_dim=16, layer_types=["sliding_attention", "full_attention",
                                                            "sliding_attention"],
    )),
}  # fmt: skip


def make_tiny_windowed(out: Path, shape: str, seed: int = 0) -> Path:
    """A tiny random sliding-window model (transformers' own class) of one of ``WINDOW_SHAPES``."""
    arch, kw = WINDOW_SHAPES[shape]
    kw = dict(kw)
    tie = kw.pop("tie", False)
    return make_tiny_model(out, arch, tie, seed=seed, initializer_range=0.1, **kw)


def window_of(shape: str) -> int:
    return WINDOW_SHAPES[shape][1]["sliding_window"]


def chat_topic(client, topic: str, words: int = 140) -> dict:
    """A one-message chat of ``words`` numbered words (~2 tokens each) through a TestClient; the response."""
    text = " ".join(f"{topic}{i}" for i in range(words))
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 2,
        "temperature": 0,
    }
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def server_client(model_dir, store=None, keys=None, page_size: int = 16, **engine_kwargs):
    """An in-process server (FastAPI's TestClient) on ``model_dir``: fp32, 256 pages, an optional disk
    store and API keys (``engine_kwargs``: more engine options, e.g. ``kv_store_size``); server
    exceptions come back as responses, as a client sees them."""
    from fastapi.testclient import TestClient

    from kvreuse.runtime.engine.async_engine import AsyncEngine
    from kvreuse.runtime.engine.engine import Engine
    from kvreuse.runtime.server.app import create_app
    from kvreuse.runtime.server.state import ServerConfig

    engine = Engine(model_dir=str(model_dir), dtype="float32", device="cpu", num_pages=256, page_size=page_size,
                    kv_store=None if store is None else str(store), **engine_kwargs)  # fmt: skip
    aengine = AsyncEngine(engine)
    app = create_app(aengine, ServerConfig("tiny", api_keys=keys or {}), on_shutdown=aengine.shutdown)
    return TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False)
