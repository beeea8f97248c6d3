"""The gRPC worker's parts without processes: the KV event hub over a real radix cache, the params mapping.

The hub is driven as the servicer drives it, with ``run_on_engine`` running its function at once
(there is no engine thread here): a subscriber joining a tree that already holds pages gets
``cleared`` and those pages first, then every later store and eviction, in order, once.
"""

from __future__ import annotations

import asyncio

import pytest
from smg_grpc_proto.generated import vllm_engine_pb2

from kvreuse.runtime.cache.page_allocator import PageAllocator
from kvreuse.runtime.cache.radix_cache import RadixCache
from kvreuse.runtime.request import CacheScope
from kvreuse.runtime.server.errors import APIError
from kvreuse.runtime.server.grpc import kv_stream
from kvreuse.runtime.server.grpc.kv_stream import KvEventHub, Overflow
from kvreuse.runtime.server.grpc.servicer import sampling_params

PS = 4


async def _direct(fn):
    return fn(None)


async def _take(stream, n_events: int) -> list:
    out = []
    async for batch in stream:
        out.extend(batch.events)
        if len(out) >= n_events:
            return out
    return out


def test_a_late_subscriber_gets_the_tree_then_every_change_once() -> None:
    tree = RadixCache(PS, PageAllocator(16), "lru")
    hub = KvEventHub(PS)
    assert hub.install(tree)
    tree.insert(list(range(8)), tree.allocator.alloc(2))  # before anyone listens
    # alice shares the public first page (public_len): the public run splits at the fork
    tree.insert(list(range(4)) + [9, 9, 9, 9], tree.allocator.alloc(2), CacheScope("alice", public_len=PS))

    async def run() -> list:
        stream = hub.stream(_direct, tree, lambda: False)
        first = await _take(stream, 1)
        while sum(len(e.stored.blocks) for e in first) < 3:
            first += await _take(stream, 1)
        tree.insert(list(range(8)) + [5, 5, 5, 5], tree.allocator.alloc(3))
        tree.evict(16)
        later = await _take(stream, 1)
        while sum(len(e.removed.block_hashes) for e in later) < 4:
            later += await _take(stream, 1)
        await stream.aclose()
        return first, later

    first, later = asyncio.run(run())
    assert first[0].WhichOneof("data") == "cleared"
    blocks = {b.block_hash: (e.stored, list(b.token_ids)) for e in first[1:] for b in e.stored.blocks}
    assert sorted(t for _, t in blocks.values()) == [[0, 1, 2, 3], [4, 5, 6, 7], [9, 9, 9, 9]]
    salts = {tuple(t): s.cache_salt if s.HasField("cache_salt") else None for s, t in blocks.values()}
    assert salts == {(0, 1, 2, 3): None, (4, 5, 6, 7): None, (9, 9, 9, 9): "alice"}
    for stored, _ in blocks.values():  # every run hangs off a block told before it, or the root
        assert not stored.HasField("parent_block_hash") or stored.parent_block_hash in blocks
    new = later[0].stored
    assert [list(b.token_ids) for b in new.blocks] == [[5, 5, 5, 5]] and new.parent_block_hash in blocks
    gone = [h for e in later[1:] for h in e.removed.block_hashes]
    assert sorted(gone) == sorted(set(blocks) | {new.blocks[0].block_hash})  # everything evicted, once
    assert [e.event_id for e in first + later] == list(range(1, len(first) + len(later) + 1))


def test_a_subscriber_that_falls_behind_is_cut_off(monkeypatch) -> None:
    monkeypatch.setattr(kv_stream, "QUEUE_LIMIT", 3)
    tree = RadixCache(PS, PageAllocator(64), "lru")
    hub = KvEventHub(PS)
    hub.install(tree)

    async def run() -> None:
        stream = hub.stream(_direct, tree, lambda: False)
        await _take(stream, 1)  # subscribed: the snapshot's cleared
        for i in range(6):  # nobody reads meanwhile
            tree.insert([i] * PS, tree.allocator.alloc(1))
        await _take(stream, 100)

    with pytest.raises(Overflow):
        asyncio.run(run())
    assert hub._subs == []


def test_proto_params_mean_what_vllm_means() -> None:
    sp = vllm_engine_pb2.SamplingParams
    unset = sampling_params(sp(), prompt_len=10, max_len=100)
    assert (unset.temperature, unset.top_p, unset.top_k, unset.max_tokens) == (1.0, 1.0, -1, 90)
    given = sampling_params(sp(temperature=0, top_k=5, max_tokens=7, stop=["\n"], seed=3), 10, 100)
    assert (given.temperature, given.top_k, given.max_tokens, given.stop, given.seed) == (0, 5, 7, ["\n"], 3)
    for bad in (sp(n=2), sp(json_schema="{}"), sp(logprobs=1)):
        with pytest.raises(APIError):
            sampling_params(bad, 10, 100)
