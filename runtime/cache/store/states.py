"""Window checkpoints below the pool: the state a sliding-window model resumes from, kept beside its pages.

A window model's prefix resumes only where a window snapshot exists (``runtime/cache/node_states.py``),
so pages that go down to the host or disk tier are worth nothing on return without the snapshot at
their end.  This store keeps each snapshot under the page key of the page it ends (the same chain of
keys the pages use, so the same namespace rules: a private session's snapshot is keyed in its own
namespace and never matches another's prefix), in host memory (LRU in a byte budget) and, with a disk
store, as one file per snapshot in a ``window_states/`` folder of the store (whose fingerprint already
names the model, dtype and page size), its name carrying the key and the file a sha256 of the tensor
bytes, checked on every read: a corrupt file is deleted and its prefix recomputed.  The files stay
within ``disk_bytes`` (their share of ``--kv-store-size``): the least recently used go first (a read
renews a file's time), and a page whose snapshot went resumes from an earlier one or is recomputed.
A write that fails (a full disk, the folder gone) drops that snapshot with one warning (``failed``
counts them) and a crash mid-write leaves only a ``.tmp`` file, deleted at the next open.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("kvreuse.store")


class StateTier:
    """Host (LRU, ``host_bytes``) and optional disk copies of node states, keyed by page key."""

    def __init__(
        self,
        host_bytes: int,
        directory: Path | None = None,
        encode: Callable[[Any], torch.Tensor] = lambda s: s,
        decode: Callable[[torch.Tensor], Any] = lambda t: t,
        disk_bytes: int = 0,
    ) -> None:
        """``encode``/``decode``: a node state to the tensor kept here and back (a window snapshot to its
        host K/V, and back onto the device)."""
        self.encode, self.decode = encode, decode
        self.host_bytes = host_bytes
        self._host: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self._nbytes = 0
        self.dir, self.disk_bytes = directory, disk_bytes
        self._files: OrderedDict[Path, int] = OrderedDict()  # on disk, least recently used first -> bytes
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            for f in directory.glob("*.tmp"):  # a write a crash cut short: never renamed, never counted
                f.unlink(missing_ok=True)
            for f in sorted(directory.glob("*.state"), key=lambda f: f.stat().st_mtime):
                self._files[f] = f.stat().st_size
        self._disk_total = sum(self._files.values())
        self.stored = self.loaded = self.corrupt = self.dropped = self.failed = 0

    def __contains__(self, key: bytes) -> bool:
        return key in self._host or (self.dir is not None and self._path(key).exists())

    @property
    def nbytes(self) -> int:
        """Bytes of snapshots held in host memory."""
        return self._nbytes

    @property
    def disk_nbytes(self) -> int:
        """Bytes of snapshot files on disk (within ``disk_bytes``)."""
        return self._disk_total

    def put(self, key: bytes, state: Any, durable: bool = False) -> None:
        """Keep ``state`` for the prefix ending at page ``key``; ``durable``: on disk too."""
        kv = self.encode(state).detach().to("cpu").contiguous()
        if key not in self._host and kv.nbytes <= self.host_bytes:
            while self._host and self._nbytes + kv.nbytes > self.host_bytes:
                old_key, old = self._host.popitem(last=False)
                self._nbytes -= old.nbytes
                self._write(old_key, old)  # host overflow goes to disk, as the pages' does
            self._host[key] = kv
            self._nbytes += kv.nbytes
            self.stored += 1
        elif key not in self._host:
            self._write(key, kv)
        if durable:
            self._write(key, kv)

    def get(self, key: bytes) -> Any:
        """The state for ``key`` (host first), or None (absent, or its file failed its checksum)."""
        if key in self._host:
            self._host.move_to_end(key)
            self.loaded += 1
            return self.decode(self._host[key])
        if self.dir is None or not (path := self._path(key)).exists():
            return None
        try:
            raw = path.read_bytes()
        except OSError:  # gone since the check, or unreadable: recomputed like a corrupt one
            return None
        digest, body = raw[:32], raw[32:]
        if hashlib.sha256(body).digest() != digest:
            self._unlink(path)
            self.corrupt += 1
            return None
        if path in self._files:
            self._files.move_to_end(path)
            os.utime(path)  # the order survives a restart
        self.loaded += 1
        return self.decode(torch.load(io.BytesIO(body), weights_only=True))

    def clear(self) -> None:
        self._host.clear()
        self._nbytes = 0
        if self.dir is not None:
            for f in self.dir.glob("*.state"):
                f.unlink(missing_ok=True)
            self._files.clear()
            self._disk_total = 0

    def _write(self, key: bytes, kv: torch.Tensor) -> None:
        """Write to disk where there is one (else a snapshot leaving the host tier is gone)."""
        if self.dir is None or self._path(key).exists():
            return
        buf = io.BytesIO()
        torch.save(kv, buf)
        body = buf.getvalue()
        size = 32 + len(body)
        if size > self.disk_bytes:
            return
        while self._files and self.disk_nbytes + size > self.disk_bytes:
            self._unlink(next(iter(self._files)))
            self.dropped += 1
        path = self._path(key)
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_bytes(hashlib.sha256(body).digest() + body)
            tmp.replace(path)  # atomic: a reader sees the whole file or none
        except OSError as e:  # a full disk, the folder gone: the snapshot is dropped, never the engine
            if not self.failed:
                log.warning("window snapshots: writing one failed (%s); such prefixes are recomputed",
                            os.strerror(e.errno) if e.errno else type(e).__name__)  # fmt: skip
            self.failed += 1
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            return
        self._files[path] = size
        self._disk_total += size

    def _unlink(self, path: Path) -> None:
        path.unlink(missing_ok=True)
        self._disk_total -= self._files.pop(path, 0)

    def _path(self, key: bytes) -> Path:
        assert self.dir is not None
        return self.dir / f"{key.hex()}.state"
