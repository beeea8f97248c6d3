"""The tiers below the pool, as one object: host memory above disk, writes in the background.

``match`` says how far a chain of page keys continues in the lower tiers (host pages first,
then disk pages); ``load`` brings those pages' K/V up; ``write_back`` takes pages the pool is
about to drop and keeps them: in the host tier when there is one (its LRU overflow goes to disk),
else straight to disk on a writer thread, so the engine step that evicts never waits for a file.
A page being written is still served from the writer's queue, so nothing is lost in between.
``prefetch`` reads a waiting request's disk pages on a reader thread into a bounded staging area,
so the engine keeps computing other requests meanwhile and the admission only copies them.

A disk write that fails (the directory removed, ``groups/`` replaced by a file, a full disk) never
stops the writer: the disk tier turns read-only (``disk_error`` says why, once, in the log),
later writes are dropped, and the server runs on the pool (and the host tier) alone; ``flush``
never waits for a write that will not come.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import torch

from kvreuse.runtime.cache.store.disk import DiskStore
from kvreuse.runtime.cache.store.host import HostStore
from kvreuse.runtime.cache.store.shared_tier import SharedTier
from kvreuse.runtime.cache.store.writer import PageWriter

log = logging.getLogger("kvreuse.store")


class TierMatch(NamedTuple):
    """Leading pages of a key chain found in each lower tier (host ones first, then disk, then shared)."""

    host: int
    disk: int
    shared: int = 0

    @property
    def total(self) -> int:
        return self.host + self.disk + self.shared

    def first(self, n: int) -> TierMatch:
        """The same match cut to its first ``n`` pages."""
        host = min(self.host, n)
        disk = min(self.disk, n - host)
        return TierMatch(host, disk, min(self.shared, n - host - disk))


class TierStats(NamedTuple):
    """Counters since start and the tiers' size now."""

    loaded_host_pages: int
    loaded_disk_pages: int
    load_seconds: float  # the engine thread's time loading pages (picking up read-ahead included)
    written_pages: int
    host_pages: int
    disk_pages: int
    disk_bytes: int
    read_ahead_seconds: float = 0.0  # background disk reads (overlapping other requests' compute)
    write_failures: int = 0  # disk writes that failed (the first one makes the disk tier read-only)
    disk_error: str | None = None  # why the disk tier takes no more writes, or None
    loaded_shared_pages: int = 0
    shared_written_pages: int = 0  # pages this replica stored in the shared tier
    shared_failures: int = 0  # shared-store calls that failed (each turns the tier off for a while)
    shared_error: str | None = None  # why the shared tier is not used now, or None


class LowerTiers:
    """Host tier (optional) over disk tier (optional) over a shared tier (optional); see the module
    docstring and :mod:`kvreuse.runtime.cache.store.shared_tier`."""

    def __init__(
        self,
        host: HostStore | None,
        disk: DiskStore | None,
        staging_bytes: int = 512 << 20,
        shared: SharedTier | None = None,
    ) -> None:
        self.host = host
        self.disk = disk
        self.shared = shared
        self._staged: OrderedDict[bytes, torch.Tensor] = OrderedDict()  # read ahead from disk
        self._staged_bytes = 0
        self.staging_bytes = staging_bytes
        self._reader = ThreadPoolExecutor(1, "kvreuse-kv-prefetch") if disk is not None else None
        self._mu = threading.Lock()
        self._counts = {"host": 0, "disk": 0, "written": 0, "failed": 0}
        self.disk_error: str | None = None  # set once by the writer thread; read by anyone
        self._load_s = self._read_ahead_s = 0.0
        self._writer: PageWriter | None = None
        self._pending: dict[bytes, torch.Tensor] = {}  # queued for disk, not yet indexed there
        if disk is not None:
            if host is not None:
                host.on_evict = self._enqueue
            self._writer = PageWriter("kvreuse-kv-writer", self._write_disk, self._disk_failed, self._mu)
            self._pending = self._writer.pending  # the same dict, under the same lock as the staged pages

    # -- reads -------------------------------------------------------------------------
    def match(self, keys: Sequence[bytes], durable: bool = False, shared: bool = True) -> TierMatch:
        """Leading ``keys`` held below the pool; ``durable``: on disk (or queued for it) only;
        ``shared``: the shared tier continues the chain past host and disk."""
        n_host = self.host.match(keys) if self.host is not None and not durable else 0
        rest = keys[n_host:]
        n = 0
        while n < len(rest):
            with self._mu:
                start = n
                while n < len(rest) and (rest[n] in self._pending or rest[n] in self._staged):
                    n += 1
            if self.disk is not None and n < len(rest):
                n += self.disk.match(rest[n:])
            if n == start:
                break
        n_shared = 0
        if shared and not durable and self.shared is not None and n_host + n < len(keys):
            n_shared = self.shared.match(keys[n_host + n :])
        return TierMatch(n_host, n, n_shared)

    def load(self, keys: Sequence[bytes], m: TierMatch) -> torch.Tensor | None:
        """K/V of ``keys`` (matched as ``m``) stacked ``[n, ...]``; None if a disk group failed its check.
        Fewer than ``m.total`` rows when the shared tier's part came back short (``SharedTier.load``)."""
        t0 = time.perf_counter()
        parts = []
        if m.host:
            parts.append(self.host.get(keys[: m.host]))
        disk_keys = list(keys[m.host : m.host + m.disk])
        i = 0
        while i < len(disk_keys):
            with self._mu:
                run = []
                while i + len(run) < len(disk_keys):
                    k = disk_keys[i + len(run)]
                    t = self._pending.get(k)
                    if t is None and k in self._staged:
                        t = self._staged.pop(k)
                        self._staged_bytes -= t.numel() * t.element_size()
                    if t is None:
                        break
                    run.append(t)
            if run:
                parts.append(_rows(run))
                i += len(run)
                continue
            j = i  # the longest run the disk itself must serve
            with self._mu:
                while (
                    j < len(disk_keys)
                    and disk_keys[j] not in self._pending
                    and disk_keys[j] not in self._staged
                ):
                    j += 1
            got = self.disk.get(disk_keys[i:j])
            if got is None:
                return None
            parts.append(got)
            i = j
        if m.shared:  # the shared part may come back short: the caller keeps what did
            got = self.shared.load(keys[m.host + m.disk : m.total])
            if got:
                parts.append(torch.stack(got))
            elif not parts:
                return None
        self._counts["host"] += m.host
        self._counts["disk"] += len(disk_keys)
        self._load_s += time.perf_counter() - t0
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def prefetch(self, keys: Sequence[bytes]) -> Future | None:
        """Start reading the disk-only part of ``keys`` (leading pages below the pool) ahead of use."""
        if self._reader is None:
            return None
        m = self.match(keys, shared=False)
        with self._mu:
            todo = [k for k in keys[m.host : m.total] if k not in self._pending and k not in self._staged]
        if not todo:
            return None
        return self._reader.submit(self._stage, todo)

    def _stage(self, keys: list[bytes]) -> None:
        t0 = time.perf_counter()
        kv = self.disk.get(keys)
        with self._mu:
            self._read_ahead_s += time.perf_counter() - t0
        if kv is None:
            return
        with self._mu:
            for k, t in zip(keys, kv):
                if k not in self._staged:
                    self._staged[k] = t
                    self._staged_bytes += t.numel() * t.element_size()
            while self._staged_bytes > self.staging_bytes and self._staged:  # unclaimed reads age out
                _, old = self._staged.popitem(last=False)
                self._staged_bytes -= old.numel() * old.element_size()

    # -- writes --------------------------------------------------------------------------
    def write_back(
        self,
        parent: bytes,
        parent_is_root: bool,
        keys: list[bytes],
        tokens: list[tuple[int, ...]],
        kv: torch.Tensor,
        durable: bool = False,
    ) -> None:
        """Keep pages the pool drops (``kv`` must already be a copy: the pool pages are reused at once).

        To the host tier when there is one, else (or with ``durable``) to disk in the background.
        """
        if self.host is not None and not (durable and self.disk is not None):
            self.host.put(parent, parent_is_root, keys, tokens, kv)
        elif self.disk is not None:
            self._enqueue(parent, parent_is_root, keys, tokens, kv)

    def accepts(self, durable: bool = False) -> bool:
        """Whether ``write_back`` would keep anything (a failed disk tier takes no writes), so callers
        skip copying pages out for nothing."""
        if self.host is not None and not (durable and self.disk is not None):
            return True
        return self.disk is not None and self.disk_error is None

    def _enqueue(self, parent, parent_is_root, keys, tokens, kv) -> None:
        if self.disk_error is not None:  # read-only now: the pages are dropped, as without a store
            return
        self._writer.put(parent, parent_is_root, keys, tokens, kv)

    def _write_disk(self, parent, is_root, keys, tokens, kv) -> None:
        if self.disk_error is None:
            self._counts["written"] += self.disk.put(parent, is_root, keys, tokens, kv)

    def _disk_failed(self, e: Exception) -> None:
        self._counts["failed"] += 1
        if self.disk_error is None:
            self.disk_error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            log.warning("KV store write failed, the disk tier is read-only from now on: %s", self.disk_error)

    def flush(self, drain_host: bool = False) -> None:
        """Wait until every queued write is on disk (and, with ``drain_host``, the host tier too)."""
        if drain_host and self.host is not None and self.disk is not None:
            self.host.drain()
        if self._writer is not None:
            self._writer.flush()
        if self.shared is not None:
            self.shared.flush()

    def clear(self) -> None:
        """Drop every page of every lower tier (after the queued writes land, so none arrives later)."""
        self.flush()
        with self._mu:
            self._staged.clear()
            self._staged_bytes = 0
        if self.host is not None:
            self.host.clear()
        if self.disk is not None:
            self.disk.clear()
        if self.shared is not None:
            self.shared.clear()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.shutdown(wait=True)
            self._reader = None
        self.flush(drain_host=True)
        if self._writer is not None:
            self._writer.close()
        if self.disk is not None:
            self.disk.close()
        if self.shared is not None:
            self.shared.close()

    @property
    def error(self) -> str | None:
        """Why a tier runs degraded (the disk tier read-only, the shared store unreachable), or None."""
        if self.disk_error is not None:
            return f"disk tier read-only: {self.disk_error}"
        if self.shared is not None and self.shared.error is not None:
            return f"shared KV store unreachable: {self.shared.error}"
        return None

    def share(
        self, parent: bytes, parent_is_root: bool, keys: list[bytes], tokens: list, kv: torch.Tensor
    ) -> None:
        """Write pages through to the shared tier (in the background)."""
        self.shared.write(parent, parent_is_root, keys, tokens, kv)

    def check(self) -> None:
        """Every tier's invariants (see ``HostStore.check`` and ``DiskStore.check``)."""
        if self.host is not None:
            self.host.check()
        if self.disk is not None:
            self.disk.check()
            with self._mu:
                pending = set(self._pending)
            lost = {
                k
                for k in self.disk.orphan_parents()
                if k not in pending and (self.host is None or k not in self.host) and not self.disk.match([k])
            }  # the last test: the writer may have stored it since the first query
            if lost:
                raise AssertionError(f"{len(lost)} disk pages have a parent stored in no tier")

    def stats(self) -> TierStats:
        ds = self.disk.stats() if self.disk is not None else None
        return TierStats(
            loaded_host_pages=self._counts["host"],
            loaded_disk_pages=self._counts["disk"],
            load_seconds=self._load_s,
            written_pages=self._counts["written"],
            host_pages=len(self.host) if self.host is not None else 0,
            disk_pages=ds.pages if ds else 0,
            disk_bytes=ds.nbytes if ds else 0,
            read_ahead_seconds=self._read_ahead_s,
            write_failures=self._counts["failed"],
            disk_error=self.disk_error,
            **self._shared_stats(),
        )

    def _shared_stats(self) -> dict:
        if self.shared is None:
            return {}
        c = self.shared.counts
        return dict(
            loaded_shared_pages=c["loaded"], shared_written_pages=c["written"],
            shared_failures=c["failed"], shared_error=self.shared.error,
        )  # fmt: skip


def _rows(pages: list[torch.Tensor]) -> torch.Tensor:
    """Pages stacked ``[n, ...]``: a view when they are consecutive rows of one tensor (the pages of
    a group read ahead together), a copy otherwise."""
    first, step = pages[0], pages[0].numel()
    base = first.untyped_storage().data_ptr()
    if first.is_contiguous() and all(
        p.untyped_storage().data_ptr() == base and p.storage_offset() == first.storage_offset() + i * step
        for i, p in enumerate(pages)
    ):
        return first.as_strided((len(pages), *first.shape), (step, *first.stride()))
    return torch.stack(pages)


class NoLowerTiers:
    """What the manager asks of ``LowerTiers`` when nothing is below the pool: no figures, no error."""

    error: str | None = None

    def stats(self) -> TierStats | None:
        return None

    def check(self) -> None: ...

    def close(self) -> None: ...
