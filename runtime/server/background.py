"""Work a request leaves behind after its answer (the re-rendered turn's prefill: core/rerender.py)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Coroutine, Hashable
from typing import Any


class BackgroundTasks:
    """The server's background tasks, held until done (the event loop keeps only weak references to a
    task, so one nobody holds can be collected mid-run); ``counts`` are what they report (tests, logs)."""

    def __init__(self) -> None:
        self.pending: dict[asyncio.Task, Hashable] = {}  # task -> the tenant whose request left it
        self.counts: Counter[str] = Counter()

    def start(self, work: Coroutine[Any, Any, None], tenant: Hashable = None) -> None:
        """Run ``work`` on the running event loop for ``tenant``, held until it ends."""
        task = asyncio.get_running_loop().create_task(work)
        self.pending[task] = tenant
        task.add_done_callback(lambda t: self.pending.pop(t, None))

    async def settled(self, *tenants: Hashable) -> None:
        """Wait for the tasks ``tenants``' requests left so far (every tenant's when none is named), not
        those started meanwhile, so a busy server never starves the waiter: a tenant's next request then
        reads what they cached whatever the timing (its cached tokens are the same on every replay of
        the same traffic), and a cache reset is not refilled by a prefill still running."""
        mine = [t for t, owner in self.pending.items() if not tenants or owner in tenants]
        if mine:
            await asyncio.gather(*mine, return_exceptions=True)

    async def cancel(self) -> None:
        """Stop every task and wait until each has ended (at shutdown): a task inside the engine has
        queued its request's abort when this returns, so the engine is idle after its next turn rather
        than whenever the event loop's teardown gets to the task."""
        tasks = list(self.pending)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
