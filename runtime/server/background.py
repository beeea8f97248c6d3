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

    async def settled(self, tenant: Hashable) -> None:
        """Wait for the tasks ``tenant``'s requests left so far (not those started meanwhile, so a
        busy tenant is never starved): its next request then reads what they cached whatever the
        timing, so its cached tokens are the same on every replay of the same traffic."""
        mine = [t for t, owner in self.pending.items() if owner == tenant]
        if mine:
            await asyncio.gather(*mine, return_exceptions=True)

    async def drained(self) -> None:
        """Wait for every task started so far (and those they start)."""
        while self.pending:
            await asyncio.gather(*list(self.pending), return_exceptions=True)
