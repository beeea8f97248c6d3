"""What makes stored KV reusable: a digest of the weights and of everything that shapes K/V.

A store written by one model must never be served to another.  The fingerprint covers the
weights' bytes, the dtype, the page size, the KV layout (layers, KV heads, head dim), the rope
settings and the engine settings that change the K/V (weight quantization); anything else in
``config.json`` is included too, since a changed field may
change the K/V (a new norm epsilon, say).  Hashing a model's weights reads every byte, so the
digest of each weight file is remembered beside the cache, keyed by path, size and mtime.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

FORMAT_VERSION = 3  # 3: group files name their pages' keys (2: CRC-32 group checksums; 1: blake2b-128)
_CHUNK = 1 << 24


def file_digest(path: Path, memo_dir: Path | None = None) -> str:
    """blake2b of a file's bytes, remembered in ``memo_dir`` under (path, size, mtime)."""
    st = path.stat()
    memo = None
    if memo_dir is not None:
        tag = hashlib.blake2b(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode(), digest_size=16)
        memo = memo_dir / f"{tag.hexdigest()}.digest"
        if memo.is_file():
            return memo.read_text().strip()
    h = hashlib.blake2b(digest_size=20)
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    digest = h.hexdigest()
    if memo is not None:
        try:
            memo_dir.mkdir(parents=True, exist_ok=True)
            tmp = memo.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(digest)
            os.replace(tmp, memo)
        except OSError:
            pass  # a read-only cache only costs a re-hash next time
    return digest


def weights_digest(model_dir: Path, memo_dir: Path | None = None) -> str:
    """One digest over every ``*.safetensors`` file of a model directory (names and bytes)."""
    h = hashlib.blake2b(digest_size=20)
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    for f in files:
        h.update(f.name.encode() + b"\0" + file_digest(f, memo_dir).encode())
    return h.hexdigest()


def fingerprint(
    model_dir: Path,
    dtype: str,
    page_size: int,
    memo_dir: Path | None = None,
    settings: dict | None = None,
) -> str:
    """The store key: weights digest + dtype + page size + the whole model config + format version +
    every engine ``settings`` that changes the K/V computed from the same weights (``quantize``: an
    int8 model's K/V differ from the dense one's, and it must never be served another's)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    facts = {
        "format": FORMAT_VERSION,
        "weights": weights_digest(model_dir, memo_dir),
        "dtype": str(dtype).removeprefix("torch."),
        "page_size": page_size,
        "config": config,
        "settings": settings or {},
    }
    blob = json.dumps(facts, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(blob, digest_size=20).hexdigest()
