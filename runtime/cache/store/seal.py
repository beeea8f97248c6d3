"""How a shared-tier entry proves it is sound: a CRC against corruption, or with a cluster secret an
HMAC-SHA256 against forgery too.

Any client of the Valkey server can write an entry, and a CRC anyone can recompute: a forged page
with a fresh CRC was served as this replica's own K/V (a replica answered ``"Memo\\nMemo\\nMem"``).
With ``--kv-shared-secret-file`` every entry carries an HMAC over its name and bytes under the
secret the replicas share, so only a holder of the secret can write an entry a replica accepts
(a copy under another name fails too).  Without a secret the CRC remains (the store is then only
as trusted as everyone who can reach it; ``kvreuse serve`` warns once).
"""

from __future__ import annotations

import hashlib
import hmac
import zlib
from collections.abc import Sequence
from pathlib import Path


class CrcSeal:
    """Corruption only: ``KVR1`` + CRC-32 of the body."""

    magic, size = b"KVR1", 8

    def seal(self, name: bytes, parts: Sequence[bytes | memoryview]) -> bytes:
        crc = 0
        for part in parts:
            crc = zlib.crc32(part, crc)
        return self.magic + crc.to_bytes(4, "little")

    def check(self, name: bytes, blob: bytes) -> bool:
        return (
            len(blob) >= self.size
            and blob[:4] == self.magic
            and zlib.crc32(memoryview(blob)[self.size :]) == int.from_bytes(blob[4:8], "little")
        )


class HmacSeal:
    """Authenticity: ``KVRH`` + HMAC-SHA256 of the entry's name and body under the cluster secret."""

    magic, size = b"KVRH", 36

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the shared store's secret must be at least 16 bytes")
        self._secret = secret

    def _mac(self, name: bytes, parts: Sequence[bytes | memoryview]) -> bytes:
        h = hmac.new(self._secret, name, hashlib.sha256)
        for part in parts:
            h.update(part)
        return h.digest()

    def seal(self, name: bytes, parts: Sequence[bytes | memoryview]) -> bytes:
        return self.magic + self._mac(name, parts)

    def check(self, name: bytes, blob: bytes) -> bool:
        if len(blob) < self.size or blob[:4] != self.magic:
            return False
        return hmac.compare_digest(blob[4 : self.size], self._mac(name, [memoryview(blob)[self.size :]]))


Seal = CrcSeal | HmacSeal


def read_secret(path: str | Path) -> bytes:
    """The cluster secret from a file (surrounding whitespace dropped); ValueError in one line."""
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as e:
        raise ValueError(
            f"--kv-shared-secret-file: cannot read it ({e.strerror or type(e).__name__})"
        ) from None
    if len(secret) < 16:
        raise ValueError("--kv-shared-secret-file: the secret must be at least 16 bytes")
    return secret
