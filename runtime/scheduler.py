"""Continuous batching with chunked prefill.

Each step takes every running request that needs one token (a decode), then fills a
prefill budget of ``chunk_size`` tokens with the next chunks of partly prefilled requests
and newly admitted ones.  A long prompt therefore delays running decodes by at most one
chunk.  When pages run out, the newest running request is retracted: its computed pages
go to the tree, it returns to the front of the queue with its output so far, and is later
re-prefilled (mostly from the tree).
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from runtime.cache_manager import CacheManager
from runtime.request import Request, Status

POLICIES = ("fcfs", "lpm")
LPM_MAX_QUEUE = 256  # matching every waiting request each step costs O(queue * prompt)


class Chunk(NamedTuple):
    """Tokens ``start:start+length`` of ``req`` computed this step; sampled when they end the sequence."""

    req: Request
    start: int
    length: int
    sample: bool


class Scheduler:
    """Owns the waiting queue and the running set; decides what each step computes."""

    def __init__(self, cache: CacheManager, chunk_size: int, max_running: int, policy: str = "fcfs") -> None:
        if policy not in POLICIES:
            raise ValueError(f"schedule policy must be one of {POLICIES}, got {policy!r}")
        self.cache = cache
        self.chunk_size = chunk_size
        self.max_running = max_running
        self.policy = policy
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_retractions = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def remove(self, req: Request) -> None:
        """Drop a finished or aborted request and release its pages."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.cache.release(req)
        req.status = Status.FINISHED

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[Chunk]:
        chunks: dict[Request, Chunk] = {}
        for req in list(self.running):
            # a prompt's 1-token tail is prefill, not a decode: it must come out of the chunk budget
            decoding = req.remaining == 1 and req.num_computed >= req.num_prompt
            if req not in self.running or not decoding:
                continue
            if self._reserve(req, 1, chunks):
                chunks[req] = Chunk(req, req.num_computed, 1, True)
            elif len(self.running) > 1:
                self._retract(req)  # the newest yields its pages (to the tree) so older ones progress
        budget = self.chunk_size
        for req in list(self.running):
            if budget <= 0:
                break
            prefilling = req.remaining > 1 or req.num_computed < req.num_prompt
            if req in self.running and prefilling and req not in chunks:
                n = min(req.remaining, budget)
                if not self._reserve(req, n, chunks):
                    break
                chunks[req] = Chunk(req, req.num_computed, n, n == req.remaining)
                budget -= n
        if self.policy == "lpm" and 1 < len(self.waiting) <= LPM_MAX_QUEUE:
            self.waiting = deque(sorted(self.waiting, key=lambda r: -self.cache.match_len(r.tokens, r.scope)))
        while budget > 0 and self.waiting and len(self.running) < self.max_running:
            req = self.waiting[0]
            self.cache.admit(req)
            n = min(req.remaining, budget)
            if not self.cache.reserve(req, n):
                self.cache.release(req, cache=False)
                if req.retractions == 0:
                    req.cached_tokens = -1  # measured again when it is really admitted
                break
            self.waiting.popleft()
            req.status = Status.RUNNING
            self.running.append(req)
            chunks[req] = Chunk(req, req.num_computed, n, n == req.remaining)
            budget -= n
        return list(chunks.values())

    def _reserve(self, req: Request, n: int, chunks: dict[Request, Chunk]) -> bool:
        """Reserve pages, retracting requests admitted after ``req`` (newest first) while needed.

        Only newer requests are retracted, so an old request never loses its progress to a new one.
        """
        while not self.cache.reserve(req, n):
            victims = self.running[self.running.index(req) + 1 :]
            if not victims:
                return False
            victims = victims[::-1]
            self._retract(victims[0])
            chunks.pop(victims[0], None)
        return True

    def _retract(self, req: Request) -> None:
        self.running.remove(req)
        self.cache.release(req)
        req.status = Status.WAITING
        req.retractions += 1
        self.num_retractions += 1
        self.waiting.appendleft(req)
