"""Real model-family tokenizers, offline: vocab-only GGUFs from the llama-cpp-python source distribution.

The sdist of ``llama-cpp-python`` on PyPI vendors llama.cpp's test vocabularies
(``vendor/llama.cpp/models/ggml-vocab-*.gguf``): the real tokenizers of model families with no weights.
``tokenizer_dir(family)`` fetches the sdist once with pip (``--no-binary=:all:``, never built: only the
two GGUF members are extracted), converts the GGUF to ``tokenizer.json`` once through transformers
(``gguf_file=``) and caches both under ``<kvreuse cache>/vocab``.  ``tiny_model_dir(family)`` saves a
tiny random model with that vocabulary next to it: token counts do not depend on weights, so the
pattern benchmark measures a real family's token streams at the cost of a 1-layer model.

Families: ``qwen3`` (the Qwen2 vocabulary plus Qwen3's added tokens at their real ids) and
``llama3`` (the Llama 3 BPE vocabulary with Llama 3.1's chat special tokens).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

from runtime.model_source import ModelSourceError, cache_dir

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

FAMILIES = {
    "qwen3": Family(
        "ggml-vocab-qwen2.gguf",
        tuple((151643 + i, t) for i, t in enumerate(_QWEN_ADDED)),
        151936,
        "qwen3",
        "<|im_end|>",
        None,
    ),
    "llama3": Family(
        "ggml-vocab-llama-bpe.gguf", _LLAMA_ADDED, 128256, "llama", "<|eot_id|>", "<|begin_of_text|>"
    ),
}


def vocab_root() -> Path:
    return cache_dir() / "vocab"


def fetch_gguf(family: str) -> Path:
    """The family's vocab GGUF, fetched once (both families' files are extracted from one download)."""
    dest = vocab_root() / FAMILIES[family].gguf
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    wanted = {MEMBER_DIR + f.gguf for f in FAMILIES.values()}
    with tempfile.TemporaryDirectory() as td:
        print(f"kvreuse: fetching vocab GGUFs from the {SDIST} source distribution ...", file=sys.stderr)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary=:all:",
            "-q",
            "-d",
            td,
            SDIST,
        ]
        r = subprocess.run(cmd, capture_output=True, text=True)
        sdists = list(Path(td).glob("*.tar.gz"))
        if not sdists:
            last = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
            raise ModelSourceError(f"could not fetch {SDIST} from PyPI: {last}")
        with tarfile.open(sdists[0]) as tf:
            for m in tf.getmembers():
                rel = m.name.split("/", 1)[-1]  # strip the llama_cpp_python-0.3.36/ root
                if rel in wanted and m.isfile():
                    src = tf.extractfile(m)
                    assert src is not None
                    out = vocab_root() / Path(rel).name
                    tmp = out.with_suffix(".part")
                    tmp.write_bytes(src.read())
                    tmp.rename(out)
    if not dest.is_file():
        raise ModelSourceError(f"{SDIST} has no {MEMBER_DIR}{FAMILIES[family].gguf}")
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
    """A 1-layer random model with the family's vocabulary (token accounting only: its outputs are noise)."""
    out = vocab_root() / f"{family}-tiny"
    if (out / ".complete").exists():
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fam = FAMILIES[family]
    tok_dir = tokenizer_dir(family)
    tok = load_tokenizer(family)
    cfg = AutoConfig.for_model(
        fam.arch, vocab_size=fam.vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=262144,
        tie_word_embeddings=True, eos_token_id=tok.convert_tokens_to_ids(fam.eos),
        bos_token_id=tok.bos_token_id, pad_token_id=tok.convert_tokens_to_ids(fam.eos),
    )  # fmt: skip
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
