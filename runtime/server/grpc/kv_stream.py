"""``SubscribeKvEvents``: the prefix cache's page events as SMG's ``KvEventBatch`` stream.

The hub is the cache's event listener (``runtime/cache/events.py``: a ``PageEvents`` whose sink is
here), installed once through the cache's interface (``CacheManager.listen``; ``EventSource``).  Events arrive on the engine thread; each
subscriber (a gateway's stream) has an asyncio queue they are handed to, and its own gapless
sequence numbers.  A subscriber starts with a snapshot: ``cleared`` then every node the cache holds,
parents first (``CacheManager.announce``), taken on the engine thread in the same call that registers it, so no event is missed
or told twice, and a gateway that (re)connects learns the whole cache, not only what changes later.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

from smg_grpc_proto.generated import common_pb2

from kvreuse.runtime.cache.events import ROOT_HASH, Cleared, Event, EventSource, PageEvents, Removed, Stored

QUEUE_LIMIT = 1 << 16  # events a slow subscriber may fall behind before it is cut off (it resubscribes)


class Overflow(Exception):
    """A subscriber fell ``QUEUE_LIMIT`` events behind: its index could no longer be trusted."""


def to_proto(ev: Event, event_id: int, page_size: int) -> common_pb2.KvCacheEvent:
    """One cache event as the gateway's ``KvCacheEvent``; a tenant's pages carry it as ``cache_salt``."""
    if isinstance(ev, Stored):
        stored = common_pb2.KvBlocksStored(
            blocks=[common_pb2.KvBlock(block_hash=b.block_hash, token_ids=b.token_ids, block_size=page_size)
                    for b in ev.blocks],
        )  # fmt: skip
        if ev.parent_hash != ROOT_HASH:
            stored.parent_block_hash = ev.parent_hash
        if ev.namespace is not None:
            stored.cache_salt = str(ev.namespace)
        return common_pb2.KvCacheEvent(event_id=event_id, stored=stored)
    if isinstance(ev, Removed):
        removed = common_pb2.KvBlocksRemoved(block_hashes=ev.block_hashes)
        return common_pb2.KvCacheEvent(event_id=event_id, removed=removed)
    return common_pb2.KvCacheEvent(event_id=event_id, cleared=common_pb2.KvCacheCleared())


class _Subscriber:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.queue = loop, asyncio.Queue()
        self.pending = 0  # events handed to the loop, not yet taken (read on the engine thread)
        self.dead = False


class KvEventHub:
    """The cache's event listener and its subscribers (see the module docstring)."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.events = PageEvents(page_size, self._publish)
        self._subs: list[_Subscriber] = []
        self._lock = threading.Lock()

    def install(self, cache: EventSource) -> bool:
        """Listen to ``cache`` (before requests run); False when it keeps no prefixes (no events)."""
        return cache.listen(self.events)

    def _publish(self, ev: Event) -> None:  # engine thread
        with self._lock:
            subs = list(self._subs)
        for sub in subs:
            self._hand(sub, ev)

    def _hand(self, sub: _Subscriber, ev: Event | BaseException) -> None:
        with self._lock:
            if sub.dead:
                return
            if sub.pending >= QUEUE_LIMIT:
                sub.dead = True
                ev = Overflow(f"the subscriber fell {QUEUE_LIMIT} cache events behind")
            sub.pending += 1
        try:
            sub.loop.call_soon_threadsafe(sub.queue.put_nowait, ev)
        except RuntimeError:  # its loop is closed: the server is gone, nobody reads this
            sub.dead = True

    def _subscribe(self, sub: _Subscriber, cache: EventSource) -> None:  # engine thread, between steps
        self._hand(sub, Cleared())
        # parents before their children, as a gateway's index needs them
        cache.announce(PageEvents(self.page_size, lambda ev: self._hand(sub, ev)))
        with self._lock:
            self._subs.append(sub)

    async def stream(
        self, run_on_engine, cache: EventSource, cancelled
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        """Batches for one subscriber until ``cancelled()``; ``run_on_engine(fn)`` runs ``fn`` between steps."""
        sub = _Subscriber(asyncio.get_running_loop())
        await run_on_engine(lambda _e: self._subscribe(sub, cache))
        seq = event_id = 0
        try:
            while not cancelled():
                try:
                    first = await asyncio.wait_for(sub.queue.get(), 1.0)
                except asyncio.TimeoutError:
                    continue
                events = [first]
                while not sub.queue.empty() and len(events) < 256:  # what piled up goes as one batch
                    events.append(sub.queue.get_nowait())
                with self._lock:
                    sub.pending -= len(events)
                for ev in events:
                    if isinstance(ev, BaseException):
                        raise ev
                seq += 1
                batch = common_pb2.KvEventBatch(sequence_number=seq, timestamp=time.time())
                for ev in events:
                    event_id += 1
                    batch.events.append(to_proto(ev, event_id, self.page_size))
                yield batch
        finally:
            with self._lock:
                sub.dead = True
                if sub in self._subs:
                    self._subs.remove(sub)
