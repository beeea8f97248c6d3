"""Request preparation (parsing, rendering, tokenising, grammar compiles) in a bounded thread pool
with a fair share per tenant and a deadline on the wait.

The event loop never runs this work (``/health`` keeps answering); the pool has ``threads``
threads, and one tenant may hold at most ``share`` of them at once, so a tenant flooding the
server with slow schemas or huge bodies queues behind itself while another tenant's requests
still find a free thread.  A job waits at most ``wait_s`` for its tenant's share (429 after);
its own run time is bounded by its parts (the grammar compile budget).  Without API keys every
caller is one tenant and may use every thread.

Prep threads run at a lower priority than the engine (``BACKGROUND_NICE``): on a small machine a
burst of renders and compiles would otherwise preempt the engine's intra-op threads, and every
parallel region of a forward then waits at its barrier for a thread that is not running, which
slows decoding for every tenant, not only the one preparing.

A share is held until the job's thread is done, not until its caller stops waiting: a client
that disconnects mid-render must not free a slot its work still occupies.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kvreuse.runtime.sampling.constrained.compiler import BACKGROUND_NICE, renice
from kvreuse.runtime.server.errors import APIError

T = TypeVar("T")


class PrepPool:
    """A thread pool whose threads are shared fairly between tenants (see the module docstring)."""

    def __init__(self, threads: int, share: int, wait_s: float, retry_after_s: int = 1) -> None:
        if threads < 1 or share < 1:
            raise ValueError(f"the prep pool needs >= 1 thread and share, got {threads} and {share}")
        self.threads, self.share, self.wait_s = threads, min(share, threads), wait_s
        self.retry_after_s = retry_after_s
        self._executor = ThreadPoolExecutor(
            threads,
            thread_name_prefix="kvreuse-prep",
            initializer=lambda: renice(threading.get_native_id(), BACKGROUND_NICE),
        )
        self._slots: dict[Hashable, asyncio.Semaphore] = {}

    def _slot(self, tenant: Hashable) -> asyncio.Semaphore:
        if tenant not in self._slots:  # no keys: one tenant, every thread
            self._slots[tenant] = asyncio.Semaphore(self.threads if tenant is None else self.share)
        return self._slots[tenant]

    async def run(self, tenant: Hashable, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a prep thread within ``tenant``'s share; 429 if no share frees in time."""
        slot = self._slot(tenant)
        try:
            await asyncio.wait_for(slot.acquire(), self.wait_s)
        except TimeoutError:
            raise APIError(
                429, f"this key's requests are still being prepared (a share of {self.share} of "
                f"{self.threads} prep threads, waited {self.wait_s:g} s); retry shortly",
                type="rate_limit_error", code="prep_busy", headers={"Retry-After": str(self.retry_after_s)},
            ) from None  # fmt: skip
        loop = asyncio.get_running_loop()
        try:
            fut = self._executor.submit(fn, *args)
        except BaseException:
            slot.release()
            raise
        fut.add_done_callback(lambda _: _release(loop, slot))
        return await asyncio.wrap_future(fut)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _release(loop: asyncio.AbstractEventLoop, slot: asyncio.Semaphore) -> None:
    """Give ``slot`` back on its loop; a job that outlived the server's loop has no one to give it to."""
    try:
        loop.call_soon_threadsafe(slot.release)
    except RuntimeError:  # the loop is closed
        pass
