"""Work a request leaves behind after its answer (the re-rendered turn's prefill: core/rerender.py)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Coroutine
from typing import Any


class BackgroundTasks:
    """The server's background tasks, held until done (the event loop keeps only weak references to a
    task, so one nobody holds can be collected mid-run); ``counts`` are what they report (tests, logs)."""

    def __init__(self) -> None:
        self.pending: set[asyncio.Task] = set()
        self.counts: Counter[str] = Counter()

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` on the running event loop, held until it ends."""
        task = asyncio.get_running_loop().create_task(work)
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def drained(self) -> None:
        """Wait for every task started so far (and those they start)."""
        while self.pending:
            await asyncio.gather(*list(self.pending), return_exceptions=True)
