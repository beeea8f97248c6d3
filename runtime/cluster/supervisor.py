"""Keeps a cluster's parts running: every part that exits is started again, however often it fails.

One :class:`Watch` per part (the store, each replica, the gateway), each on a thread of its own, so a
replica that takes minutes to load its weights never delays the gateway's restart.  A part that is
down is restarted; a restart that fails (the new process exits while loading, never becomes ready,
its port is taken) is reported and tried again after a backoff that doubles up to ``max_s``.  The
invariant: nothing a part does ends the supervision of another, nor the cluster; only ``stop`` does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Backoff:
    """Seconds between a failed restart and the next try: ``first_s``, doubling, at most ``max_s``."""

    first_s: float = 1.0
    max_s: float = 30.0

    def after(self, failures: int) -> float:
        return min(self.max_s, self.first_s * 2 ** max(0, failures - 1))


@dataclass
class PartState:
    """What the supervisor knows of one part: for reports and ``cluster.json``."""

    restarts: int = 0  # successful restarts
    failures: int = 0  # failed restarts since the part was last up
    down_since: float | None = None  # monotonic time it was found down, None while up
    last_error: str | None = None
    recoveries_s: list[float] = field(default_factory=list)  # down -> ready again, each time


class Watch:
    """One part: how to tell it is alive and how to start it again (which blocks until it is ready
    or raises).  ``restart`` must leave no half-started process behind when it raises."""

    def __init__(self, name: str, alive: Callable[[], bool], restart: Callable[[], None]) -> None:
        self.name, self.alive, self.restart = name, alive, restart
        self.state = PartState()


class Supervisor:
    """Runs a :class:`Watch` per part (see the module docstring); ``report`` gets one line per event."""

    def __init__(
        self,
        watches: list[Watch],
        report: Callable[[str], None],
        backoff: Backoff = Backoff(),
        interval_s: float = 0.5,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.watches, self.report, self.backoff = watches, report, backoff
        self.interval_s, self.on_change = interval_s, on_change
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for w in self.watches:
            t = threading.Thread(target=self._run, args=(w,), name=f"supervise {w.name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Start no more restarts (one in progress ends when its part is stopped: :meth:`join`)."""
        self._stop.set()

    def join(self, timeout_s: float = 30.0) -> None:
        for t in self._threads:
            t.join(timeout=timeout_s)

    def _run(self, w: Watch) -> None:
        while not self._stop.wait(self.interval_s):
            if not w.alive() and not self._stop.is_set():
                self.step(w)

    def step(self, w: Watch) -> None:
        """One restart of a part found down; on failure, wait out the backoff (or a stop)."""
        s = w.state
        if s.down_since is None:
            s.down_since = time.monotonic()
            self.report(f"{w.name} is down; restarting")
        try:
            w.restart()
        except Exception as e:  # noqa: BLE001 - any failure of one part is reported, never raised
            s.failures += 1
            s.last_error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            wait = self.backoff.after(s.failures)
            self.report(f"{w.name} failed to restart ({s.failures}x): {s.last_error}; next try in {wait:g} s")
            self.on_change()
            self._stop.wait(wait)
            return
        s.recoveries_s.append(round(time.monotonic() - s.down_since, 2))
        s.restarts, s.failures, s.down_since = s.restarts + 1, 0, None
        self.report(f"{w.name} is back after {s.recoveries_s[-1]:g} s (restart {s.restarts})")
        self.on_change()
