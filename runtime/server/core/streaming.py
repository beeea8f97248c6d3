"""Merging the n choices' output streams, and streaming responses that report errors in-band and always
release their admission (each protocol says how an error looks in its stream)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from kvreuse.chat_templates.tool_calls import ParsedDelta
from kvreuse.runtime.engine.async_engine import EngineDead, RequestFailed
from kvreuse.runtime.engine.outputs import RequestOutput

log = logging.getLogger("kvreuse.server")


def join_parsed(a: ParsedDelta, b: ParsedDelta) -> ParsedDelta:
    return ParsedDelta(a.content + b.content, a.reasoning + b.reasoning, a.tool_calls + b.tool_calls)


async def final_outputs(outputs: AsyncIterator[tuple[int, RequestOutput]]) -> list[RequestOutput]:
    """Drain merged choice streams (non-streamed responses); the finished outputs in choice order."""
    outs: dict[int, RequestOutput] = {}
    async with aclosing(outputs) as merged:
        async for i, out in merged:
            if out.finished:
                outs[i] = out
    return [outs[i] for i in range(len(outs))]


async def merge_streams(
    streams: list[AsyncIterator[RequestOutput]],
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave the choices' streams as outputs arrive; leaving early cancels (and so aborts) them all."""
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, s: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in s:
                q.put_nowait((i, out))
        except Exception as e:  # surfaced to the consumer below
            q.put_nowait((i, e))
        finally:
            q.put_nowait((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            i, item = await q.get()
            if item is None:
                left -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def guarded_events(
    events: AsyncIterator[str],
    request_id: str,
    release: Callable[[], None],
    error_events: Callable[[Exception], list[str]],
) -> GuardedStream:
    """Stream ``events``; an error after the headers went out is reported in-band (as the
    protocol's ``error_events`` say), and ``release`` runs however the stream ends."""

    async def body() -> AsyncIterator[str]:
        try:
            async with aclosing(events) as it:
                async for event in it:
                    yield event
        except Exception as e:
            if isinstance(e, EngineDead | RequestFailed):
                log.error("stream %s ended: %s", request_id, e)
            else:
                log.exception("stream %s failed", request_id)
            for err in error_events(e):
                yield err
        finally:
            release()

    return GuardedStream(body(), release)


class GuardedStream(StreamingResponse):
    """A streaming response that runs ``on_close`` however it ends (even if the body never starts)."""

    def __init__(self, body: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class Once:
    """Wraps a release function so it runs at most once."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn: Callable[[], None] | None = fn

    def __call__(self) -> None:
        fn, self._fn = self._fn, None
        if fn is not None:
            fn()
