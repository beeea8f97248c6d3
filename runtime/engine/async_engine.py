"""The engine loop in a background thread, with per-request async token streams.

The thread owns all engine state; other threads talk to it only through the engine's
inbox (submit / abort / call_between_steps), and it hands outputs back through ``loop.call_soon_threadsafe``.

Failures: a request the engine failed (``finish_reason == "error"``) ends its stream with
``RequestFailed``; the loop goes on.  If the loop itself dies, ``error`` is set, every stream
waiting now gets ``EngineDead`` at once, every later ``stream()`` raises it, and ``on_death``
runs (the server uses it to exit non-zero so a supervisor restarts the process).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable

from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.engine.outputs import RequestOutput
from kvreuse.runtime.request import Request
from kvreuse.runtime.sampling.params import SamplingParams

log = logging.getLogger("kvreuse.engine")


class RequestFailed(RuntimeError):
    """The engine failed this one request (the message says why); other requests are unaffected."""


class EngineDead(RuntimeError):
    """The engine loop has stopped (crashed or shut down); nothing more will be generated."""


class AsyncEngine:
    """Wraps an ``Engine``; ``stream()`` yields ``RequestOutput`` snapshots as tokens arrive."""

    def __init__(self, engine: Engine, on_death: Callable[[BaseException], None] | None = None) -> None:
        self.engine = engine
        self.on_death = on_death
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvreuse-engine", daemon=True)
        self.error: BaseException | None = None
        self.beat = time.monotonic()  # the loop's last turn: /health calls a loop silent too long stalled
        self._thread.start()

    @property
    def num_pending(self) -> int:
        return len(self._streams)

    async def stream(self, req: Request) -> AsyncIterator[RequestOutput]:
        """Submit ``req`` (built by ``Engine.make_request``) and yield outputs until finished; a caller
        that goes away aborts the request."""
        q: asyncio.Queue = asyncio.Queue()
        with self._lock:
            # checked under the lock _fail_all takes, so no stream can register after it ran and wait forever
            if self.error is not None:
                raise EngineDead(f"the engine stopped: {self.error}")
            if self._stop.is_set():
                raise EngineDead("the engine was shut down")
            self._streams[req.request_id] = (asyncio.get_running_loop(), q)
        self.engine.submit(req)
        self._wake.set()
        finished = False
        try:
            while True:
                out = await q.get()
                if isinstance(out, BaseException):
                    raise out
                if out.finish_reason == "error":
                    finished = True
                    raise RequestFailed(f"the engine failed this request: {out.error}")
                yield out
                if out.finished:
                    finished = True
                    return
        finally:
            with self._lock:
                self._streams.pop(req.request_id, None)
            if not finished:
                self.engine.abort(req.request_id)
                self._wake.set()

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> RequestOutput:
        last = None
        async for out in self.stream(self.engine.make_request(prompt, params, request_id)):
            last = out
        assert last is not None
        return last

    def stalled_for(self) -> float:
        """Seconds the loop has been inside one turn (a step, a call between steps); ~0 when idle."""
        return time.monotonic() - self.beat

    def run_idle(self, fn, timeout: float = 30.0):
        """Run ``fn(engine)`` on the engine thread between steps (e.g. a cache reset); returns its result.

        Raises EngineDead if the loop has stopped, TimeoutError if it does not get to it within ``timeout``.
        """
        if self.error is not None or not self._thread.is_alive():
            raise EngineDead(f"the engine stopped: {self.error or 'shut down'}")
        done = threading.Event()
        box: list = []

        def call() -> None:
            try:
                box.append(fn(self.engine))
            except BaseException as e:  # handed to the caller, not fatal to the loop
                box.append(e)
            done.set()

        self.engine.call_between_steps(call)
        self._wake.set()
        if not done.wait(timeout) or not self._thread.is_alive() and not box:
            raise TimeoutError("the engine thread did not answer")
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def _run(self) -> None:
        eng = self.engine
        while not self._stop.is_set():
            self.beat = time.monotonic()
            if not eng.has_work():
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                outs = eng.step()
            except BaseException as e:  # the loop itself broke (not one request): nothing can go on
                self._die(e)
                return
            with self._lock:
                targets = [(o, self._streams.get(o.request_id)) for o in outs]
            for out, target in targets:
                if target is not None:
                    loop, q = target
                    loop.call_soon_threadsafe(q.put_nowait, out)

    def _die(self, e: BaseException) -> None:
        log.critical("engine loop died", exc_info=e)
        with self._lock:
            self.error = e
        self._fail_all(EngineDead(f"the engine stopped: {e}"))
        if self.on_death is not None:
            self.on_death(e)

    def _fail_all(self, e: BaseException) -> None:
        with self._lock:
            for loop, q in self._streams.values():
                if not loop.is_closed():  # a stream whose loop is gone has no one waiting
                    loop.call_soon_threadsafe(q.put_nowait, e)

    def shutdown(self, timeout: float = 5.0, reason: str = "the engine was shut down") -> None:
        with self._lock:
            self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        self._fail_all(EngineDead(reason))  # else callers still waiting hang forever
        if not self._thread.is_alive():  # the engine's state is ours now: persist the KV tiers, stop TP ranks
            self.engine.close()
