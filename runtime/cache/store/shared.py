"""The shared tier's store: KV pages in a Valkey (or Redis) server that every replica reads and writes.

One entry per page, named by the same chained key as the disk tier's pages
(:mod:`kvreuse.runtime.cache.store.page_keys`: the whole prefix, the tenant namespace), under a prefix that
is the model's fingerprint, so two models (or two quantizations) never share an entry::

    name  : b"kvr:" + fingerprint[:20] + b":" + page key (16 bytes)
    value : seal (``KVR1`` + CRC-32, or with a cluster secret ``KVRH`` + HMAC-SHA256 of name and rest:
            :mod:`kvreuse.runtime.cache.store.seal`) | fingerprint (20 B) | key | parent | is_root |
            n tokens | tokens (int64) | dtype | ndim | pad | shape (u32) | pad zero bytes | K/V bytes

The value repeats the fingerprint and the key, so an entry written for another model, or copied
under another name, is refused like a corrupt or forged one; every refused entry read is deleted (so
the next writer stores a good copy) and the caller recomputes those tokens.
The budget is the server's: ``maxmemory`` with an LRU policy evicts pages, and a chain whose middle
page went simply stops matching there.  This class only talks to the server; the background writer,
the failure handling and the accounting are :class:`kvreuse.runtime.cache.store.shared_tier.SharedTier`'s.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Sequence
from typing import NamedTuple
from urllib.parse import parse_qsl, urlencode, urlsplit

import torch

from kvreuse.runtime.cache.store.seal import CrcSeal, HmacSeal, Seal

_HEAD = struct.Struct("<20s16s16s?I")  # fingerprint, key, parent, parent is root, token count
_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.uint8]


class SharedStats(NamedTuple):
    """What the server says of itself."""

    pages: int  # entries of this model's fingerprint (SCAN-counted only on request: 0 otherwise)
    used_bytes: int
    budget: int  # maxmemory (0: unbounded)
    policy: str


def connect(url: str, timeout_s: float = 2.0):
    """A Valkey client for ``valkey://``, ``redis://`` or ``unix://`` URLs (no retries: a dead store
    must fail fast, the caller degrades to the pool)."""
    try:
        import valkey  # here, so an engine without a shared store never imports the client
    except ImportError:
        from kvreuse.runtime.cache.store.disk import StoreError

        raise StoreError(
            "--kv-shared-store needs the Valkey client: pip install 'kvreuse[cluster]'"
        ) from None

    if url.startswith("redis://"):
        url = "valkey://" + url.removeprefix("redis://")
    return valkey.Valkey.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)


def public_url(url: str) -> str:
    """``url`` without its password (``valkey://user:secret@host`` and ``?password=`` alike): what logs
    and the live page show (the page is every tenant's, the store's credentials are the operator's)."""
    u = urlsplit(url)
    netloc = u.netloc.rpartition("@")[2]
    if u.username:
        netloc = f"{u.username}@{netloc}"
    query = urlencode([(k, v) for k, v in parse_qsl(u.query, keep_blank_values=True) if k != "password"])
    # by hand, not urlunsplit: it drops the "//" of an empty host (``unix:///run/valkey.sock``)
    return f"{u.scheme}://{netloc}{u.path}" + (f"?{query}" if query else "")


class SharedStore:
    """Pages of one model in a Valkey server (see the module docstring); every method may raise the
    client's ``ConnectionError`` / ``TimeoutError`` when the server is gone."""

    def __init__(
        self, url: str, fingerprint: str, timeout_s: float = 2.0, secret: bytes | None = None
    ) -> None:
        self.url = public_url(url)  # for logs; the password stays in the client
        self.seal: Seal = HmacSeal(secret) if secret is not None else CrcSeal()
        self.fp = bytes.fromhex(fingerprint)[:20].ljust(20, b"\0")
        self.prefix = b"kvr:" + self.fp.hex().encode() + b":"
        self.db = connect(url, timeout_s)

    def name(self, key: bytes) -> bytes:
        return self.prefix + key

    # -- reads -----------------------------------------------------------------------
    def match(self, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` the server holds (one round trip)."""
        if not keys:
            return 0
        pipe = self.db.pipeline(transaction=False)
        for k in keys:
            pipe.exists(self.name(k))
        n = 0
        for found in pipe.execute():
            if not found:
                break
            n += 1
        return n

    def get(self, keys: Sequence[bytes]) -> tuple[list[torch.Tensor], int]:
        """The K/V of the leading ``keys`` that are here and sound, and how many entries were refused:
        a corrupt, forged or foreign one ends the run, and every refused entry read is deleted (so the
        next writer stores a good copy), not only the first."""
        blobs = self.db.mget([self.name(k) for k in keys])
        pages: list[torch.Tensor] = []
        bad: list[bytes] = []
        run = True
        for k, blob in zip(keys, blobs):
            kv = None if blob is None else self.decode(k, blob)
            if kv is None and blob is not None:
                bad.append(self.name(k))
            run = run and kv is not None
            if run:
                pages.append(kv)  # type: ignore[arg-type]
        if bad:
            self.db.delete(*bad)
        return pages, len(bad)

    def decode(self, key: bytes, blob: bytes) -> torch.Tensor | None:
        """One entry's K/V, or None unless it is ours: seal (checksum or HMAC), fingerprint and key."""
        base = self.seal.size
        if len(blob) < base + _HEAD.size or not self.seal.check(self.name(key), blob):
            return None
        fp, k, _parent, _root, n_tok = _HEAD.unpack_from(blob, base)
        if fp != self.fp or k != key:
            return None
        at = base + _HEAD.size + 8 * n_tok
        if at + 3 > len(blob) or blob[at] >= len(_DTYPES):
            return None
        dtype, ndim, pad = _DTYPES[blob[at]], blob[at + 1], blob[at + 2]
        if at + 3 + 4 * ndim > len(blob):
            return None
        shape = struct.unpack_from(f"<{ndim}I", blob, at + 3)
        start = at + 3 + 4 * ndim + pad
        count = int(torch.Size(shape).numel())
        if len(blob) - start != count * dtype.itemsize:
            return None
        with warnings.catch_warnings():  # a view of the read-only reply: callers stack (copy) it at once
            warnings.simplefilter("ignore", UserWarning)
            return torch.frombuffer(blob, dtype=dtype, count=count, offset=start).view(shape)

    def encode(
        self, key: bytes, parent: bytes, parent_is_root: bool, tokens: Sequence[int], kv: torch.Tensor
    ) -> bytes:
        """One page's entry (``kv``: its ``[layers, 2, page_size, heads, dim]`` K/V on the host)."""
        kv = kv.detach().to("cpu").contiguous()
        head = self.seal.size + _HEAD.size + 8 * len(tokens) + 3 + 4 * kv.dim()
        pad = -head % 16  # the K/V starts 16-byte aligned in the entry: a misaligned copy is slow
        parts = [
            _HEAD.pack(self.fp, key, parent, parent_is_root, len(tokens)),
            struct.pack(f"<{len(tokens)}q", *tokens),
            bytes((_DTYPES.index(kv.dtype), kv.dim(), pad)),
            struct.pack(f"<{kv.dim()}I", *kv.shape),
            bytes(pad),
            memoryview(kv.view(torch.uint8).numpy()) if kv.numel() else b"",
        ]
        return b"".join([self.seal.seal(self.name(key), parts), *parts])  # the page's bytes copied once

    # -- writes ----------------------------------------------------------------------
    def put(
        self,
        parent: bytes,
        parent_is_root: bool,
        keys: Sequence[bytes],
        tokens: Sequence[Sequence[int]],
        kv: torch.Tensor,
    ) -> int:
        """Store consecutive pages (``kv[i]`` is page ``keys[i]``) after ``parent``; returns pages new.
        ``SET NX``: a page another replica stored first is left as it is (same key, same K/V)."""
        pipe = self.db.pipeline(transaction=False)
        prev, prev_root = parent, parent_is_root
        for i, k in enumerate(keys):
            pipe.set(self.name(k), self.encode(k, prev, prev_root, tokens[i], kv[i]), nx=True)
            prev, prev_root = k, False
        return sum(1 for ok in pipe.execute(raise_on_error=False) if ok is True)

    def clear(self) -> int:
        """Delete every page of this model (another model's pages stay); returns how many."""
        n = 0
        batch = []
        for name in self.db.scan_iter(match=self.prefix + b"*", count=1000):
            batch.append(name)
            if len(batch) >= 1000:
                n += self.db.delete(*batch)
                batch = []
        if batch:
            n += self.db.delete(*batch)
        return n

    def stats(self, count_pages: bool = False) -> SharedStats:
        mem = self.db.info("memory")
        pages = sum(1 for _ in self.db.scan_iter(match=self.prefix + b"*", count=1000)) if count_pages else 0
        return SharedStats(
            pages,
            int(mem.get("used_memory", 0)),
            int(mem.get("maxmemory", 0)),
            str(mem.get("maxmemory_policy", "")),
        )

    def close(self) -> None:
        self.db.close()
