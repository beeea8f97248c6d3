"""Random-weight Qwen3.5 text checkpoints for benchmarks: real architecture, no download.

``python -m kvreuse.benchmarks.serving.random_hybrid [--shape NAME]`` prints the checkpoint directory (built once
under ``<kvreuse cache>/bench``) to pass as ``--model`` to any benchmark.  Weights come from
transformers' own initialisation (Qwen3_5ForCausalLM, seed 0); the tokenizer is the embedded
SmolLM2's, so prompts are real text.  Speed and reuse do not depend on the weights' values.

Also prints the bytes of one linear-attention state snapshot for the real Qwen3.5 sizes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from kvreuse.runtime.loading.model_source import cache_dir, resolve_model
from kvreuse.runtime.models.config import ModelConfig

# cpu: the largest that keeps a 4K-token, 10-turn benchmark to minutes on 2 shared cores (~39M
# non-embedding parameters); real: Qwen3.5-27B's text model (for GPUs with random weights).
SHAPES = {
    "cpu": dict(
        hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
        linear_key_head_dim=64, linear_value_head_dim=64,
    ),
    "qwen3.5-27b": dict(
        hidden_size=5120, intermediate_size=17408, num_hidden_layers=64, num_attention_heads=24,
        num_key_value_heads=4, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=48,
        linear_key_head_dim=128, linear_value_head_dim=128,
    ),
}  # fmt: skip
# transformers' Qwen3_5TextConfig defaults are the "Qwen3.5-9B style" configuration
REAL_SIZES = {
    "qwen3.5-9b-style (transformers defaults)": dict(num_hidden_layers=32, vocab_size=248320),
    "qwen3.5-27b": dict(SHAPES["qwen3.5-27b"], vocab_size=248320),
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)


def random_hybrid_dir(shape: str = "cpu") -> Path:
    """The checkpoint directory for ``shape``, written on first use."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3_5TextConfig

    out = cache_dir() / "bench" / f"qwen3_5-random-{shape}"
    if (out / ".complete").is_file():
        return out
    src = resolve_model(None)[0]
    cfg = Qwen3_5TextConfig(
        vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1,
        eos_token_id=2, pad_token_id=0, **SHAPES[shape],
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    tmp = out.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for f in TOKENIZER_FILES:
        if (src / f).exists():
            shutil.copy(src / f, tmp / f)
    (tmp / ".complete").write_text("ok\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def snapshot_bytes(overrides: dict, dtype_bytes: int = 2) -> dict[str, int]:
    """One snapshot (every linear layer's recurrent fp32 state + conv window) vs KV bytes per token."""
    from transformers import Qwen3_5TextConfig

    mc = ModelConfig.from_dict(Qwen3_5TextConfig(**overrides).to_dict())
    assert mc.linear_attn is not None
    n_lin = sum(t == "linear_attention" for t in mc.layer_types)
    snap = n_lin * mc.linear_attn.state_bytes(dtype_bytes)
    kv = mc.kv_bytes_per_token(dtype_bytes)
    return {
        "linear_layers": n_lin,
        "snapshot_bytes": snap,
        "kv_bytes_per_token": kv,
        "tokens_of_kv": snap // kv,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m kvreuse.benchmarks.serving.random_hybrid", description=__doc__.splitlines()[0]
    )
    p.add_argument("--shape", choices=sorted(SHAPES), default="cpu")
    p.add_argument("--sizes", action="store_true", help="print snapshot bytes of the real sizes instead")
    args = p.parse_args(argv)
    if args.sizes:
        for name, kw in REAL_SIZES.items():
            print(name, snapshot_bytes(kw), "(bf16 conv window, fp32 recurrent state)")
        return 0
    print(random_hybrid_dir(args.shape))
    return 0


if __name__ == "__main__":
    sys.exit(main())
