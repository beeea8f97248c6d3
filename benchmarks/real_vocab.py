"""Real model-family tokenizers, offline: vocab-only GGUFs from the llama-cpp-python source distribution.

The sdist of ``llama-cpp-python`` on PyPI vendors llama.cpp's test vocabularies
(``vendor/llama.cpp/models/ggml-vocab-*.gguf``): the real tokenizers of model families with no weights.
``tokenizer_dir(family)`` fetches the sdist once with pip (``--no-binary=:all:``, never built: only the
two GGUF members are extracted), converts the GGUF to ``tokenizer.json`` once through transformers
(``gguf_file=``) and caches both under ``<kvreuse cache>/vocab``.  ``tiny_model_dir(family)`` saves a
tiny random model with that vocabulary next to it: token counts do not depend on weights, so the
pattern benchmark measures a real family's token streams at the cost of a 1-layer model.

Families: ``qwen3`` (the Qwen2 vocabulary plus Qwen3's added tokens at their real ids), ``llama3``
(the Llama 3 BPE vocabulary with Llama 3.1's chat special tokens) and ``qwen35`` (llama.cpp's Qwen3.5
test vocab: the Qwen2 token list with Qwen3.5's pre-tokenizer, Qwen3's added tokens; its tiny model
is a Qwen3.5 hybrid, one linear-attention and one full-attention layer).  The sdist is fetched
through ``kvreuse.runtime.loading.pypi_files`` like the embedded model's wheel.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

from kvreuse.runtime.loading.model_source import ModelSourceError, cache_dir
from kvreuse.runtime.loading.pypi_files import FetchError, fetch_members

SDIST = "llama-cpp-python==0.3.36"
MEMBER_DIR = "vendor/llama.cpp/models/"


class Family(NamedTuple):
    """A tokenizer family: which vendored GGUF, its added special tokens, and the tiny model's config."""

    gguf: str
    added: tuple[tuple[int, str], ...]  # (real id, token) that must exist after conversion
    vocab_size: int  # the real model's embedding rows (padding included)
    arch: str
    eos: str
    bos: str | None
    tiny: tuple[tuple[str, object], ...] = ()  # the tiny model's config beyond the common one


# Qwen2.5/Qwen3's added tokens after the 151,643 byte-level BPE tokens (Qwen3's tokenizer_config.json);
# Qwen3 added the last four (<tool_response>, </tool_response>, <think>, </think>).
_QWEN_ADDED = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
    "</tool_response>", "<think>", "</think>",
)  # fmt: skip
# Llama 3.1's named specials among the 256 reserved ids after the 128,000 BPE tokens.
_LLAMA_ADDED = (
    (128000, "<|begin_of_text|>"), (128001, "<|end_of_text|>"), (128006, "<|start_header_id|>"),
    (128007, "<|end_header_id|>"), (128008, "<|eom_id|>"), (128009, "<|eot_id|>"), (128010, "<|python_tag|>"),
)  # fmt: skip

_QWEN_ADDED_IDS = tuple((151643 + i, t) for i, t in enumerate(_QWEN_ADDED))
FAMILIES = {
    "qwen3": Family(
        "ggml-vocab-qwen2.gguf",
        _QWEN_ADDED_IDS,
        151936,
        "qwen3",
        "<|im_end|>",
        None,
    ),
    "llama3": Family(
        "ggml-vocab-llama-bpe.gguf", _LLAMA_ADDED, 128256, "llama", "<|eot_id|>", "<|begin_of_text|>"
    ),
    # llama.cpp's qwen35 test vocab is the Qwen2 token list (151,936 ids, the added tokens as [PAD] placeholders)
    # with the qwen35 pre-tokenizer (combining marks kept with letters); the released Qwen3.5 vocabulary has
    # 248,320 ids, which no package ships.  So: Qwen3's added tokens at their Qwen3 ids, a hybrid tiny model.
    "qwen35": Family(
        "ggml-vocab-qwen35.gguf",
        _QWEN_ADDED_IDS,
        151936,
        "qwen3_5_text",
        "<|im_end|>",
        None,
        (
            ("num_hidden_layers", 2),
            ("layer_types", ["linear_attention", "full_attention"]),
            ("linear_num_key_heads", 1),
            ("linear_num_value_heads", 2),
            ("linear_key_head_dim", 8),
            ("linear_value_head_dim", 8),
        ),
    ),  # fmt: skip
}


def vocab_root() -> Path:
    return cache_dir() / "vocab"


def fetch_gguf(family: str) -> Path:
    """The family's vocab GGUF, fetched once (every family's missing file comes out of one download)."""
    dest = vocab_root() / FAMILIES[family].gguf
    if dest.is_file():
        return dest
    wanted = {MEMBER_DIR + f.gguf: vocab_root() / f.gguf for f in FAMILIES.values()}
    try:
        fetch_members(
            SDIST, {m: d for m, d in wanted.items() if not d.is_file()}, sdist=True, what="vocab GGUFs"
        )
    except FetchError as e:
        raise ModelSourceError(str(e)) from e
    return dest


def tokenizer_dir(family: str) -> Path:
    """A directory with the family's ``tokenizer.json`` (converted from the GGUF once, ~45 s)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown tokenizer family {family!r}; choose from {', '.join(FAMILIES)}")
    out = vocab_root() / f"{family}-tokenizer"
    if (out / ".complete").exists():
        return out
    fam = FAMILIES[family]
    gguf = fetch_gguf(family)
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    print(f"kvreuse: converting {gguf.name} to tokenizer.json (once) ...", file=sys.stderr)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=with_added_tokens(tok.backend_tokenizer, fam.added, gguf.name),
        eos_token=fam.eos,
        bos_token=fam.bos,
        pad_token=fam.eos,
    )
    tmp = Path(tempfile.mkdtemp(dir=vocab_root()))
    fast.save_pretrained(tmp)
    (tmp / ".complete").write_text(gguf.name)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def with_added_tokens(backend: Any, added: tuple[tuple[int, str], ...], source: str) -> Any:
    """The tokenizer with each ``(id, text)`` as a special token at that id.

    The vendored GGUFs pad the vocabulary with ``[PAD<id>]`` placeholders (or reserved names) where the
    later model versions put their added tokens; those ids are renamed in place so every id is real.
    """
    from tokenizers import Tokenizer

    d = json.loads(backend.to_str())
    vocab, by_id = d["model"]["vocab"], {a["id"]: a for a in d["added_tokens"]}
    for idx, text in added:
        old = by_id.get(idx)
        if old is None or (text in vocab and vocab[text] != idx):
            raise ModelSourceError(f"{source}: no placeholder at id {idx} for {text}")
        if old["content"] != text:
            vocab.pop(old["content"], None)
            vocab[text] = idx
            old["content"] = text
        old.update(special=True, normalized=False)
    return Tokenizer.from_str(json.dumps(d))


def load_tokenizer(family: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir(family))


def tiny_model_dir(family: str) -> Path:
    """A 1-layer (qwen35: 2-layer hybrid) random model with the family's vocabulary (token accounting
    only: its outputs are noise)."""
    out = vocab_root() / f"{family}-tiny"
    if (out / ".complete").exists():
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fam = FAMILIES[family]
    tok_dir = tokenizer_dir(family)
    tok = load_tokenizer(family)
    kw = dict(
        vocab_size=fam.vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=262144,
        tie_word_embeddings=True, eos_token_id=tok.convert_tokens_to_ids(fam.eos),
        bos_token_id=tok.bos_token_id, pad_token_id=tok.convert_tokens_to_ids(fam.eos),
    )  # fmt: skip
    cfg = AutoConfig.for_model(fam.arch, **{**kw, **dict(fam.tiny)})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    tmp = Path(tempfile.mkdtemp(dir=vocab_root()))
    model.save_pretrained(tmp, safe_serialization=True)
    for f in tok_dir.iterdir():
        if f.is_file() and f.name != ".complete":
            shutil.copy(f, tmp / f.name)
    (tmp / ".complete").write_text(json.dumps({"family": family}))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out
