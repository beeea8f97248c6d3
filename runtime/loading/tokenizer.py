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
