"""Tiny random HF models saved to disk, so tests load them the way users load real ones."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from runtime.model_source import resolve_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def embedded_dir() -> Path:
    return resolve_model(None)[0]


def make_tiny_model(
    out: Path, arch: str = "llama", tie: bool = False, vocab: int = 512, seed: int = 0, **overrides
) -> Path:
    """Random-initialised ``arch`` (llama, qwen2, qwen3, qwen3_moe, mistral) with GQA, saved as safetensors."""
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
            elif name.endswith("mlp.gate.weight"):  # MoE router: decisive picks, no near-ties to flip
                p.mul_(25.0)
    model.save_pretrained(out, safe_serialization=True)
    src = embedded_dir()
    for f in TOKENIZER_FILES:
        if (src / f).exists():
            shutil.copy(src / f, out / f)
    return out


def load_hf(model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
