"""Belady's offline reference for a sliding-window model's prefix cache (pages *and* window
snapshots), and the token-level replay of the engine's window-model cache it is compared to.

A window model (Gemma 3/4 with window paging) resumes a prefix only where both hold: the
full-attention layers' pages of the prefix are in the tree, and a ``WindowSnapshot`` (every window
layer's last W keys) sits exactly at its end.  The engine keeps the two in **separate budgets**:
pages in the KV pool (``num_pages``), snapshots in ``NodeStates`` (``--snapshot-memory`` bytes, LRU,
a snapshot dropped with its node's pages).  Every snapshot of one model has the same size, so the
byte budget is a count of snapshots, and both sides here are given it as ``snapshots``.

**Where snapshots go** is the engine's own code: ``window_states`` builds the engine's
``StateSlots`` (through ``kvreuse.runtime.engine.states.state_slots``, as ``Engine`` does) over
``ReplayWindowPool``, which answers ``WindowPool``'s slot calls and hands out snapshots that have
only a size.  ``placements`` feeds that object a request's chunks (prefill in ``chunk_size`` pieces
from its hit, then one decode token at a time, as the single-request scheduler does) and reads back
the points it snapshots: the prompt's last page boundary, the request's end (prompt + output), a
cut-back KV match (a divergence point), every ``--snapshot-every`` pages.

**The replay** (``window_cache`` passed to ``kvreuse.benchmarks.traces.belady.replay``) runs the trace through the
real scheduler, cache manager, radix tree and ``NodeStates`` with that ``StateSlots``: exactly the
engine's window-model cache without the model (``tests/test_window_belady.py`` checks it against an
Engine on a tiny random Gemma 3, request by request).

**The reference** (``belady_window``) is a Belady-style offline schedule of both resources, aiming
at the most cached prompt tokens over the trace (the token hit rate) with the pages within
``num_pages`` beside the running request's own and the snapshots within ``snapshots``.  A
request's hit is the longest whole-page prefix of ``prompt[:-1]`` whose pages are all resident and
that ends at a resident snapshot (the tree's rule).  Uses are forecast from the whole trace: a
request's *potential* hit is the deepest point on its path where a snapshot could be (placed by an
earlier request, with forks at the longest KV prefix shared with any earlier request); a page is
used by the requests whose potential hit covers it; a snapshot by those whose potential hit ends
there or, in a second forecast, also by those that pass it on the way (they fall back to it when
theirs is gone: sub-agents' shared prefix).  Pages are evicted furthest next use first (deepest
first among equals: the resident set stays prefix-closed); snapshots furthest next use first
within their own budget (shallower first among equals; a new one may be dropped at once).  An
evicted page takes its snapshot with it, and a leaf left without a snapshot at its end takes its
pages back to the nearest snapshot or fork: a match through them would be cut back there anyway.
The better of the two forecasts' schedules is the reference.

Why a heuristic: a page is worth keeping only while a snapshot at its users' match end is, and
snapshot points move with the hits, so with two resources Belady's exchange argument no longer
gives the optimum.  The reference is a feasible offline schedule (both budgets hold, snapshots only
where the engine places them for the same hits), so at most the true optimum; it is checked never
to fall below any policy's replay (the benchmark's ``bound_holds`` on every trace and budget,
``tests/test_window_belady.py`` on the quick traces).  ``kvreuse.benchmarks.traces.belady.belady`` on the same pool
ignores window state (every page boundary resumes): window state only cuts hits back, so it is the
upper bound, reported beside the reference.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from types import SimpleNamespace
from typing import NamedTuple

from kvreuse.benchmarks.traces.belady import NEVER, Trace, page_ids
from kvreuse.runtime.cache.manager import CacheManager
from kvreuse.runtime.cache.state_slots import StateSlots
from kvreuse.runtime.engine.config import EngineConfig
from kvreuse.runtime.engine.states import state_slots
from kvreuse.runtime.request import Request
from kvreuse.runtime.sampling.params import SamplingParams


class SizedSnapshot(NamedTuple):
    """A window snapshot as the cache sees it: only its size (``NodeStates`` budgets bytes)."""

    nbytes: int


class ReplayWindowPool:
    """``WindowPool``'s calls that ``StateSlots`` makes, without rings: slots are numbers, snapshots sizes."""

    keeps_snapshots = True  # the fact ``state_slots`` reads, as a window pool's
    splice_span = None  # matches end only where a snapshot is taken (no splicing of two) in this replay

    def __init__(self, num_slots: int, snapshot_bytes: int) -> None:
        self.num_slots = num_slots
        self.snapshot_bytes = snapshot_bytes
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        return self._free.pop()

    def free(self, slot: int) -> None:
        self._free.append(slot)

    def empty_snapshot(self) -> SizedSnapshot:
        return SizedSnapshot(self.snapshot_bytes)

    def restore(self, slot: int, snap: SizedSnapshot, end: int) -> None:
        pass  # nothing computes here: a restored ring is only its match length


def window_states(
    page_size: int, snapshots: int, snapshot_every: int = 0, slots: int = 1, snapshot_bytes: int = 1
) -> tuple[StateSlots, int]:
    """The engine's ``StateSlots`` for a window model and its ``NodeStates`` budget of ``snapshots``."""
    cfg = EngineConfig(
        page_size=page_size, snapshot_memory=snapshots * snapshot_bytes, snapshot_every=snapshot_every
    )
    runner = SimpleNamespace(state_pool=ReplayWindowPool(slots, snapshot_bytes))
    states, budget = state_slots(runner, cfg)  # type: ignore[arg-type]  # only .state_pool is read
    assert isinstance(states, StateSlots) and budget is not None
    return states, budget


def window_cache(
    num_pages: int, page_size: int, policy: str, snapshots: int, snapshot_every: int = 0
) -> CacheManager:
    """The cache manager a window model's engine builds (pool pages of the full layers, snapshots in
    ``NodeStates``), for ``kvreuse.benchmarks.traces.belady.replay(..., cache=...)``."""
    states, budget = window_states(page_size, snapshots, snapshot_every)
    return CacheManager(num_pages, page_size, "radix", policy, states=states, state_budget=budget)


def placements(
    states: StateSlots, prompt_len: int, computed_len: int, cached: int, kv_len: int, chunk_size: int
) -> list[int]:
    """Token counts at which the engine snapshots a request that hit ``cached`` tokens of a ``kv_len``
    KV match and computes up to ``computed_len`` (prompt + output[:-1])."""
    req = Request("placement", [], prompt_len, SamplingParams(), frozenset())
    req.num_computed = cached
    states.admit(req, None, kv_len)
    for start in range(cached, prompt_len, chunk_size):
        states.step_input([(req, start, min(chunk_size, prompt_len - start))])
    for pos in range(prompt_len, computed_len):
        states.step_input([(req, pos, 1)])
    ps = states.page_size
    points = sorted(n for n, _ in states.take(req, computed_len // ps * ps, leaving=True))
    states.release(req)
    return points


class _Uses:
    """Sorted request indices per id; ``next(i, r)``: the first use after request ``r``."""

    def __init__(self) -> None:
        self.at: dict[int, list[int]] = {}

    def add(self, i: int, r: int) -> None:
        self.at.setdefault(i, []).append(r)

    def next(self, i: int, r: int) -> int:
        lst = self.at.get(i, ())
        k = bisect.bisect_right(lst, r)
        return lst[k] if k < len(lst) else NEVER


def _leading(ids: Sequence[int], n: int, held: set[int]) -> int:
    k = 0
    while k < n and ids[k] in held:
        k += 1
    return k


def _deepest(ids: Sequence[int], upto: int, points: set[int]) -> int:
    return next((k for k in range(upto, 0, -1) if ids[k - 1] in points), 0)


def _forecast(trace: Trace, page_size: int, chunk_size: int, states: StateSlots, fallback: bool):
    """Per request (ids, matchable pages, resident pages, prompt and computed length); page and
    snapshot uses by potential hits (``fallback``: a snapshot is also used by the requests that pass
    it on the way to their potential hit, which fall back to it if that one is gone)."""
    reqs, seen, points = [], set(), set()
    page_uses, snap_uses = _Uses(), _Uses()
    for r, (prompt, output) in enumerate(trace):
        computed = list(prompt) + list(output[:-1])
        ids = page_ids(computed, len(computed) // page_size, page_size)
        n_match = (len(prompt) - 1) // page_size
        kv = _leading(ids, n_match, seen)
        hit = _deepest(ids, kv, points)
        for k in range(hit):
            page_uses.add(ids[k], r)
        for k in range(1, hit + 1) if fallback else [hit] if hit else []:
            if ids[k - 1] in points:
                snap_uses.add(ids[k - 1], r)
        pts = placements(states, len(prompt), len(computed), hit * page_size, kv * page_size, chunk_size)
        points.update(ids[n // page_size - 1] for n in pts)
        seen.update(ids)
        reqs.append((ids, n_match, -(-len(computed) // page_size), len(prompt), len(computed)))
    return reqs, page_uses, snap_uses


def belady_window(
    trace: Trace,
    num_pages: int,
    page_size: int,
    snapshots: int,
    chunk_size: int = 512,
    snapshot_every: int = 0,
) -> list[int]:
    """Cached tokens of each request under the better of the two offline schedules of pages and
    snapshots (the two forecasts of a snapshot's uses: the module docstring)."""
    states, _ = window_states(page_size, snapshots, snapshot_every)
    runs = [
        _schedule(
            *_forecast(trace, page_size, chunk_size, states, fallback),
            states,
            num_pages,
            snapshots,
            chunk_size,
        )
        for fallback in (False, True)
    ]
    return max(runs, key=sum)


def _schedule(
    reqs: list,
    page_uses: _Uses,
    snap_uses: _Uses,
    states: StateSlots,
    num_pages: int,
    snapshots: int,
    chunk_size: int,
) -> list[int]:
    """The offline schedule under one forecast of uses: cached tokens per request."""
    page_size = states.page_size
    depth = {pid: d for ids, *_ in reqs for d, pid in enumerate(ids)}
    parent = {pid: ids[d - 1] if d else None for ids, *_ in reqs for d, pid in enumerate(ids)}
    kids: dict[int, int] = {}  # resident page -> its resident children
    pages: dict[int, int] = {}  # resident page -> the next use its heap entry was pushed with
    snaps: dict[int, int] = {}  # resident snapshot (id of the page it ends) -> next use
    page_heap: list[tuple[int, int, int]] = []
    snap_heap: list[tuple[int, int, int]] = []

    def keep_page(pid: int, r: int) -> None:
        if pid not in pages and parent[pid] is not None:
            kids[parent[pid]] = kids.get(parent[pid], 0) + 1
        pages[pid] = page_uses.next(pid, r)
        heapq.heappush(page_heap, (-pages[pid], -depth[pid], pid))

    def drop_page(pid: int | None, held: set[int]) -> None:
        """Evict ``pid``, then the pages above it up to a snapshot or a fork: a match through them
        would be cut back to the snapshot anyway, so they hold nothing a hit can use."""
        while pid is not None and pid not in held and pid in pages and not kids.get(pid):
            del pages[pid]
            snaps.pop(pid, None)  # a snapshot goes with its node's pages
            pid = parent[pid]
            if pid is not None:
                kids[pid] -= 1
                if pid in snaps:
                    break

    def keep_snap(sid: int, r: int) -> None:
        snaps[sid] = snap_uses.next(sid, r)
        heapq.heappush(snap_heap, (-snaps[sid], depth[sid], sid))  # shallower first among equals

    hits = []
    for r, (ids, n_match, resident, prompt_len, computed_len) in enumerate(reqs):
        kv = _leading(ids, n_match, set(pages))
        hit = _deepest(ids, kv, set(snaps))
        hits.append(hit * page_size)
        held = set(ids[:hit])
        for pid in held:  # their next use moved on
            keep_page(pid, r)
        if hit:
            keep_snap(ids[hit - 1], r)
        skipped = []
        while len(pages) + resident - hit > num_pages and page_heap:
            nu, d, pid = heapq.heappop(page_heap)
            if pages.get(pid) != -nu:
                continue  # stale entry
            if -nu <= r:  # a use forecast for a request whose hit stopped short of it: the next one
                keep_page(pid, r)
            elif pid in held or kids.get(pid):
                skipped.append((nu, d, pid))
            else:
                drop_page(pid, held)
        for item in skipped:
            heapq.heappush(page_heap, item)
        assert len(pages) + resident - hit <= num_pages, "a trace request does not fit the pool"
        for pid in ids[hit:]:
            if pid not in pages:
                keep_page(pid, r)
        for n in placements(states, prompt_len, computed_len, hit * page_size, kv * page_size, chunk_size):
            if ids[n // page_size - 1] not in snaps:
                keep_snap(ids[n // page_size - 1], r)
        while len(snaps) > snapshots and snap_heap:
            nu, _, sid = heapq.heappop(snap_heap)
            if snaps.get(sid) != -nu:
                continue  # stale entry
            if -nu <= r:
                keep_snap(sid, r)
            else:
                del snaps[sid]
                drop_page(sid, set())  # a leaf's pages past the snapshot below it are dead now
    return hits
