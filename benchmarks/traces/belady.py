"""Belady's offline optimum for a prefix cache of KV pages, and the token-level replay it is compared to.

A trace is a list of finished requests ``(prompt, output)``, run one after another.  Both sides
use the cache manager's rules: a request can reuse the whole pages of ``prompt[:-1]``, and the
pages it leaves behind are the whole pages of ``prompt + output[:-1]`` (the last sampled token
never gets K/V).

Belady evicts the cached page whose next use is furthest in the future, pages never used again
first, and among equals the deepest page of a prefix first.  A page's next use is never later
than that of a page below it (a request that reaches the child passes the parent), so the cached
set stays prefix-closed, like a radix tree.  While a request runs, its own pages are resident and
its hits cannot be evicted: the cache keeps at most ``num_pages`` minus what the request adds.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

from kvreuse.runtime.cache.manager import CacheManager
from kvreuse.runtime.request import Request
from kvreuse.runtime.sampling.params import SamplingParams
from kvreuse.runtime.sampling.sampler import SampleResult
from kvreuse.runtime.scheduler import Scheduler

Trace = Sequence[tuple[list[int], list[int]]]
NEVER = 1 << 60


def page_ids(tokens: Sequence[int], n_pages: int, page_size: int) -> list[int]:
    """One id per whole page, naming the page by the whole prefix that ends with it."""
    ids, h = [], 0
    for i in range(n_pages):
        h = hash((h, tuple(tokens[i * page_size : (i + 1) * page_size])))
        ids.append(h)
    return ids


def working_set_pages(trace: Trace, page_size: int) -> int:
    """Distinct whole pages the trace leaves behind (what a pool would need to keep everything)."""
    seen: set[int] = set()
    for prompt, output in trace:
        computed = list(prompt) + list(output[:-1])
        seen.update(page_ids(computed, len(computed) // page_size, page_size))
    return len(seen)


def belady(trace: Trace, num_pages: int, page_size: int) -> list[int]:
    """Cached tokens of each request under the offline optimum (see the module docstring)."""
    return offline(trace, num_pages, page_size, knows_when=True)


def which_oracle(trace: Trace, num_pages: int, page_size: int) -> list[int]:
    """Cached tokens of each request when eviction knows *which* pages will be used again but not
    *when*: pages never used again first (deepest first), LRU among the rest.  What Belady gains
    beyond it is timing alone."""
    return offline(trace, num_pages, page_size, knows_when=False)


def offline(trace: Trace, num_pages: int, page_size: int, knows_when: bool) -> list[int]:
    """Cached tokens of each request under an eviction that reads the future: its next use
    (``knows_when``: Belady) or only whether there is one.  Both orders keep the cached set
    prefix-closed: a page is used no later, and was used no earlier, than any page below it."""
    matchable, kept = [], []
    uses: dict[int, list[int]] = {}
    depth: dict[int, int] = {}
    for r, (prompt, output) in enumerate(trace):
        computed = list(prompt) + list(output[:-1])
        ids = page_ids(computed, len(computed) // page_size, page_size)
        n_match = (len(prompt) - 1) // page_size
        matchable.append(ids[:n_match])
        kept.append((ids, -(-len(computed) // page_size)))
        for d, pid in enumerate(ids):
            depth[pid] = d
            if d < n_match:
                uses.setdefault(pid, []).append(r)

    def rank(pid: int, r: int) -> tuple[int, ...]:
        """Smallest evicted first; ``r`` is the request that last used ``pid``."""
        lst = uses.get(pid, ())
        i = bisect.bisect_right(lst, r)
        next_use = lst[i] if i < len(lst) else NEVER
        return (-next_use, -depth[pid]) if knows_when else (next_use != NEVER, r, -depth[pid])

    cached: set[int] = set()
    key: dict[int, tuple] = {}  # the rank each heap entry was pushed with (stale entries skipped)
    heap: list[tuple] = []
    hits = []
    for r, ids in enumerate(matchable):
        n_hit = 0
        while n_hit < len(ids) and ids[n_hit] in cached:
            n_hit += 1
        hits.append(n_hit * page_size)
        held = set(ids[:n_hit])
        for pid in held:  # their next use moved on
            key[pid] = rank(pid, r)
            heapq.heappush(heap, (*key[pid], pid))
        all_ids, resident = kept[r]
        new = resident - n_hit
        skipped = []
        while len(cached) + new > num_pages and heap:
            *k, pid = item = heapq.heappop(heap)
            if pid not in cached or key.get(pid) != tuple(k):
                continue
            if pid in held:
                skipped.append(item)
                continue
            cached.discard(pid)
            del key[pid]
        for item in skipped:
            heapq.heappush(heap, item)
        for pid in all_ids[n_hit:]:
            if pid not in cached:
                cached.add(pid)
                key[pid] = rank(pid, r)
                heapq.heappush(heap, (*key[pid], pid))
    return hits


def replay(
    trace: Trace,
    num_pages: int,
    page_size: int,
    policy: str,
    chunk_size: int = 512,
    check: bool = True,
    cache: CacheManager | None = None,
    inflight: int = 1,
) -> list[int]:
    """Cached tokens of each request through the real scheduler, cache manager and radix tree.

    Nothing is computed: each batch the scheduler hands out is committed with the trace's next
    output tokens as the samples, exactly where the engine commits sampled ones.  ``check``: the
    cache manager's integrity check after every batch (off for long production traces, where it
    would walk a large tree thousands of times).  ``cache``: a cache manager built by the caller
    (with lower tiers, say) instead of a plain one of ``num_pages`` under ``policy``.
    ``inflight``: requests kept in the scheduler at once (the next one enters as one finishes);
    1 runs the trace one request after another.
    """
    cache = cache if cache is not None else CacheManager(num_pages, page_size, "radix", policy)
    sched = Scheduler(cache, chunk_size, inflight, "fcfs")
    reqs: list[Request] = []
    live = 0
    while len(reqs) < len(trace) or sched.has_work():
        while len(reqs) < len(trace) and live < inflight:
            prompt, output = trace[len(reqs)]
            params = SamplingParams(max_tokens=len(output), ignore_eos=True)
            reqs.append(Request(str(len(reqs)), list(prompt), len(prompt), params, frozenset()))
            sched.add(reqs[-1])
            live += 1
        batch = sched.schedule()
        assert batch is not None, "a trace request does not fit the pool"
        tokens = [
            trace[int(c.req.request_id)][1][len(c.req.tokens) - c.req.num_prompt]
            for c in batch.chunks
            if c.sample
        ]
        for s in sched.commit(batch, SampleResult(tokens, [None] * len(tokens))):
            if (reason := s.req.stop_reason(s.tokens[-1])) is not None:  # as the engine ends a request
                sched.finish(s.req, reason)
                live -= 1
        if check:
            cache.check_integrity()
    return [r.cached_tokens for r in reqs]
