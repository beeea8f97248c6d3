"""Tokenizer loading and end-of-sequence ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

# Annotations only: a lower layer names the type it is handed.
if TYPE_CHECKING:
    from kvreuse.runtime.models.config import ModelConfig


def load_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    return AutoTokenizer.from_pretrained(str(model_dir))


def text_prompt_ids(tokenizer, text: str) -> list[int]:
    """A raw text prompt's ids as the model was trained to see text: with the tokenizer's leading
    special tokens (Gemma's and Llama's BOS: without it Gemma 3 270M continues "The capital of France
    is" with " France. The The"), as transformers' ``tokenizer(text)`` and vLLM's completions give
    them.  Never a trailing one (an EOS would end the text the model is asked to continue), and not
    twice when the text already starts with them (a chat prompt rendered to text carries its BOS)."""
    plain = tokenizer.encode(text, add_special_tokens=False)
    full = tokenizer.encode(text, add_special_tokens=True)
    # the special tokens the tokenizer puts before the text: full = lead + plain (+ trail)
    n = len(plain)
    lead = next((full[:i] for i in range(len(full) - n + 1) if full[i : i + n] == plain), [])
    return plain if plain[: len(lead)] == lead else lead + plain


def eos_token_ids(model_dir: Path, cfg: ModelConfig, tokenizer) -> set[int]:
    """EOS from generation_config.json (what HF ``generate`` stops on), the config and the tokenizer."""
    ids = set(cfg.eos_token_ids)
    gc = Path(model_dir) / "generation_config.json"
    if gc.is_file():
        eos = json.loads(gc.read_text()).get("eos_token_id")
        ids |= set(eos) if isinstance(eos, list) else ({eos} if eos is not None else set())
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
