"""Random-weight checkpoints of published architectures, for benchmarks that must not download a model.

A checkpoint is what ``Engine(model_dir=...)`` loads: ``config.json``, ``model.safetensors`` and a
word-level tokenizer whose vocabulary covers every id (token ``i`` is the word ``<ti>``), so decoding
any generated id works and the benchmark needs neither the hub nor a real tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

# Shapes from the published config.json files of Qwen/Qwen3-0.6B and Qwen/Qwen3-8B.
QWEN3_COMMON: dict[str, Any] = dict(
    model_type="qwen3", vocab_size=151936, num_key_value_heads=8, head_dim=128, rope_theta=1e6,
    max_position_embeddings=40960, rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False,
    use_sliding_window=False, bos_token_id=151643, eos_token_id=151645,
)  # fmt: skip
ARCHS: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": dict(QWEN3_COMMON, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       intermediate_size=3072, tie_word_embeddings=True),
    "qwen3-8b": dict(QWEN3_COMMON, hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                     intermediate_size=12288, tie_word_embeddings=False),
    # the 0.6B layout shrunk to run on CPU in seconds: tests the benchmark's code path, not speed
    "smoke": dict(QWEN3_COMMON, vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, intermediate_size=128, tie_word_embeddings=True,
                  max_position_embeddings=4096, bos_token_id=1, eos_token_id=2),
}  # fmt: skip
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_checkpoint(arch: dict[str, Any], out: Path, device: torch.device, dtype: str, seed: int = 0):
    """Random-initialise ``arch`` on ``device`` (fast even for 8B on a GPU), save it; returns (model, config).

    The transformers model is returned with ``attn_implementation="sdpa"`` so the caller can time it on
    exactly the weights the engine loads.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**arch)
    torch.manual_seed(seed)
    with torch.device(device):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=DTYPES[dtype], attn_implementation="sdpa")
        except TypeError:  # transformers before 4.56 names it torch_dtype
            model = AutoModelForCausalLM.from_config(
                cfg, torch_dtype=DTYPES[dtype], attn_implementation="sdpa"
            )
    model.eval()
    model.save_pretrained(out)
    write_tokenizer(out, arch["vocab_size"], arch["bos_token_id"], arch["eos_token_id"])
    return model, dict(arch)


def write_tokenizer(out: Path, vocab_size: int, bos: int, eos: int) -> None:
    """A whitespace word-level tokenizer with one word per id; loads offline through AutoTokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"<t{i}>": i for i in range(vocab_size)}, unk_token="<t0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": f"<t{bos}>",
        "eos_token": f"<t{eos}>",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config))
