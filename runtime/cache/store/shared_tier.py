"""The shared tier as the engine uses it: a :class:`SharedStore` behind a writer thread and a fuse.

* **Writes in the background**: every page the pool computes is queued (``write``) and stored by the
  writer thread, so an engine step never waits for the network; a page still queued is served from
  the queue.  Unlike the disk tier the shared tier is written *through* (on insert, not on eviction):
  a replica may be killed at any moment, and the pages another replica must find are the ones it had
  computed by then.
* **A store that goes away** (connection refused, timeout, the server killed): the first failure
  logs one warning and the tier answers "nothing here" (``match`` 0, ``load`` no pages, writes dropped)
  for ``retry_s``; then the next call tries the server again, and a success logs that it is back.
  The engine runs on its pool meanwhile; a request never fails for it.
* ``known``: keys this replica has stored or found stored, remembered (bounded LRU) so the
  write-through skips pages already there without a round trip; a key the server evicted since is
  only a page not rewritten.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence

import torch

from kvreuse.runtime.cache.store.shared import SharedStore
from kvreuse.runtime.cache.store.writer import PageWriter

log = logging.getLogger("kvreuse.store")


def _store_failures() -> tuple[type[BaseException], ...]:
    import valkey.exceptions as ve

    return (ve.ConnectionError, ve.TimeoutError, ve.ResponseError, OSError)


class SharedTier:
    """The shared store with a writer thread, a failure fuse and counters (see module docstring)."""

    def __init__(self, store: SharedStore, retry_s: float = 5.0, known_keys: int = 1 << 20) -> None:
        self.store = store
        self.retry_s = retry_s
        self.error: str | None = None  # why the store is not used now (None: in use)
        self._down_until = 0.0
        self._failures = _store_failures()
        self._known: OrderedDict[bytes, None] = OrderedDict()
        self._known_max = known_keys
        self._mu = threading.Lock()
        self.counts = {"loaded": 0, "written": 0, "failed": 0, "refused": 0}
        self._writer = PageWriter("kvreuse-kv-shared-writer", self._write, self._fail, self._mu)
        self._pending = self._writer.pending  # the same dict, under the same lock as ``_known``
        # health in the background, every ``retry_s``: an idle replica learns the store went away
        # (and came back) without waiting for a request that reaches past its pool
        self._closed = threading.Event()
        self._health = threading.Thread(target=self._watch, name="kvreuse-kv-shared-health", daemon=True)
        self._health.start()

    # -- the fuse ------------------------------------------------------------------------
    def _up(self) -> bool:
        return self.error is None or time.monotonic() >= self._down_until

    def _ok(self) -> None:
        if self.error is not None:
            log.warning("shared KV store %s is reachable again; using it", self.store.url)
            with self._mu:  # it may have come back empty (a restarted server keeps nothing)
                self._known.clear()
            self.error = None

    def _watch(self) -> None:
        while not self._closed.wait(self.retry_s):
            try:
                self.store.db.ping()
            except self._failures as e:
                self._fail(e)
                continue
            self._ok()

    def _fail(self, e: BaseException) -> None:
        self.counts["failed"] += 1
        self._down_until = time.monotonic() + self.retry_s
        if self.error is None:
            self.error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            log.warning(
                "shared KV store %s failed, serving from the pool alone (retrying every %g s): %s",
                self.store.url, self.retry_s, self.error,
            )  # fmt: skip

    # -- reads ---------------------------------------------------------------------------
    def match(self, keys: Sequence[bytes]) -> int:
        """Leading ``keys`` queued here or held by the server."""
        n = 0
        with self._mu:
            while n < len(keys) and keys[n] in self._pending:
                n += 1
        if n == len(keys) or not self._up():
            return n
        try:
            found = self.store.match(keys[n:])
        except self._failures as e:
            self._fail(e)
            return n
        self._ok()
        self._remember(keys[n : n + found])
        return n + found

    def load(self, keys: Sequence[bytes]) -> list[torch.Tensor]:
        """K/V of the leading ``keys`` still here and sound (all of them, normally; fewer if one was
        evicted since ``match``, refused as corrupt or foreign, or the store failed)."""
        with self._mu:
            queued = [self._pending.get(k) for k in keys]
        if all(t is not None for t in queued):
            pages = queued
        elif not self._up():
            return []
        else:
            try:
                pages, refused = self.store.get(keys)
            except self._failures as e:
                self._fail(e)
                return []
            self._ok()
            self.counts["refused"] += refused
            if len(pages) < len(keys):
                with self._mu:
                    for k in keys[len(pages) :]:
                        self._known.pop(k, None)
        self.counts["loaded"] += len(pages)
        return pages

    def known(self, keys: Sequence[bytes]) -> int:
        """Leading ``keys`` known to be stored or queued (no round trip)."""
        n = 0
        with self._mu:
            while n < len(keys) and (keys[n] in self._known or keys[n] in self._pending):
                n += 1
        return n

    # -- writes --------------------------------------------------------------------------
    def accepts(self) -> bool:
        """Whether a write now would be kept (not while the store is down), so callers skip the copy."""
        return self._up()

    def write(
        self, parent: bytes, parent_is_root: bool, keys: list[bytes], tokens: list, kv: torch.Tensor
    ) -> None:
        """Queue consecutive pages (``kv`` a copy: pool pages are reused) for the writer thread."""
        self._writer.put(parent, parent_is_root, keys, tokens, kv)

    def _write(self, parent, is_root, keys, tokens, kv) -> None:
        if self._up():  # while the store is down the pages are dropped, as without a shared tier
            self.counts["written"] += self.store.put(parent, is_root, keys, tokens, kv)
            self._ok()
            self._remember(keys)

    def _remember(self, keys: Sequence[bytes]) -> None:
        with self._mu:
            for k in keys:
                self._known[k] = None
                self._known.move_to_end(k)
            while len(self._known) > self._known_max:
                self._known.popitem(last=False)

    # -- lifecycle -----------------------------------------------------------------------
    def flush(self) -> None:
        """Wait until every queued page is stored (or dropped because the store failed)."""
        self._writer.flush()

    def clear(self) -> None:
        """Drop this model's pages from the server (every replica's: it is one store)."""
        self.flush()
        with self._mu:
            self._known.clear()
        if not self._up():
            return
        try:
            self.store.clear()
            self._ok()
        except self._failures as e:
            self._fail(e)

    def close(self) -> None:
        self._closed.set()
        self._writer.close()
        try:
            self.store.close()
        except self._failures:
            pass
