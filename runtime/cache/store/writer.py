"""A store's background writer: pages queued by the engine, written by one thread, readable meanwhile.

The disk tier and the shared tier both write this way: the engine step that hands pages over never
waits for a file or the network; a page still queued is served from ``pending``; ``flush`` waits
until the queue is empty.  A write that raises is handed to ``on_error`` and never stops the
thread (``flush`` would wait forever on a dead writer).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import torch

WriteFn = Callable[[bytes, bool, list[bytes], list, torch.Tensor], None]


class PageWriter:
    """One writer thread over a queue of page runs (see the module docstring).  ``lock`` guards
    ``pending``; callers that keep other state under the same lock pass theirs."""

    def __init__(
        self,
        name: str,
        write: WriteFn,
        on_error: Callable[[Exception], None],
        lock: threading.Lock | None = None,
    ) -> None:
        self.write, self.on_error = write, on_error
        self.lock = lock or threading.Lock()
        self.pending: dict[bytes, torch.Tensor] = {}  # queued, not yet in the store
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def put(
        self, parent: bytes, parent_is_root: bool, keys: list[bytes], tokens: list, kv: torch.Tensor
    ) -> None:
        """Queue consecutive pages (``kv`` a copy: the pool reuses its pages at once)."""
        with self.lock:
            for k, t in zip(keys, kv):
                self.pending[k] = t
        self._queue.put((parent, parent_is_root, list(keys), list(tokens), kv))

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                self._queue.task_done()
                return
            try:
                self.write(*job)
            except Exception as e:  # noqa: BLE001 - the writer outlives every failure
                self.on_error(e)
            finally:
                with self.lock:
                    for k in job[2]:
                        self.pending.pop(k, None)
                self._queue.task_done()

    def flush(self) -> None:
        """Wait until every queued run was written (or failed)."""
        if self._thread is not None:
            self._queue.join()

    def close(self) -> None:
        if self._thread is not None:
            self.flush()
            self._queue.put(None)
            self._thread.join()
            self._thread = None
