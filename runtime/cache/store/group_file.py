"""One page group's file: a safetensors file holding one ``kv`` tensor, and its checksum.

Written with the safetensors library; read back without a copy: the file is read once into a
buffer, its CRC-32 checked over those bytes, and the tensor is a view of the buffer at the offset
the safetensors header gives (8-byte little-endian header length, JSON header, raw data: the
format's spec).  The library's own loader copies the data again, which at 236 MB per restored
conversation cost as much as reading it.  CRC-32 (zlib) instead of a cryptographic digest: it
detects truncation and flipped bytes, which is what it is for, at ~4x blake2b's speed.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import torch
from safetensors.torch import save as st_save

_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def key_tag(key: bytes) -> str:
    """What a group's file records of each page's key (hex of its first 8 bytes): enough to tell a
    swapped or foreign file from the one the index means."""
    return key[:8].hex()


def encode(kv: torch.Tensor, keys: list[bytes]) -> bytes:
    """The file's bytes for a group's ``[n_pages, ...]`` K/V; its header names the pages' keys."""
    meta = {"keys": "".join(key_tag(k) for k in keys)}
    return st_save({"kv": kv.detach().to("cpu").contiguous()}, metadata=meta)


def checksum(data: bytes | bytearray | memoryview) -> bytes:
    return zlib.crc32(data).to_bytes(4, "little")


def read(path: Path, expected: bytes) -> tuple[torch.Tensor, list[str]] | None:
    """The group's K/V (a view of the file's bytes) and its pages' key tags, or None if the file is
    missing, short, fails its checksum or is not a one-tensor safetensors file of ours."""
    try:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            buf = bytearray(size)
            if f.readinto(buf) != size:
                return None
    except OSError:
        return None
    if checksum(buf) != expected:
        return None
    try:
        return _view(buf)
    except (ValueError, KeyError, TypeError, RuntimeError):  # passed its checksum but is not ours
        return None


def _view(buf: bytearray) -> tuple[torch.Tensor, list[str]]:
    n = int.from_bytes(buf[:8], "little")
    header = json.loads(bytes(buf[8 : 8 + n]))
    info, tags = header["kv"], header.get("__metadata__", {}).get("keys", "")
    dtype, shape = _DTYPES[info["dtype"]], [int(d) for d in info["shape"]]
    start, end = (8 + n + int(o) for o in info["data_offsets"])
    count = (end - start) // dtype.itemsize
    if end > len(buf) or count != int(torch.Size(shape).numel()):
        raise ValueError("the header does not match the data")
    kv = torch.frombuffer(buf, dtype=dtype, offset=start, count=count).view(shape)
    return kv, [tags[i : i + 16] for i in range(0, len(tags), 16)]
