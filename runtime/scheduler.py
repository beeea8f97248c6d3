"""Continuous batching with chunked prefill; the scheduler owns every request's life.

``schedule()`` picks a step: every running request that needs one token (a decode), then a
prefill budget of ``chunk_size`` tokens with the next chunks of partly prefilled requests and
newly admitted ones, so a long prompt delays running decodes by at most one chunk.  When pages
run out, the newest running request is retracted: its computed pages go to the prefix cache, it
returns to the front of the queue with its output so far, and is later re-prefilled (mostly from
the cache).  ``commit()`` applies the step's result: progress, page insertion and sampled
tokens.  ``finish()`` ends a request (a stop, ``length``, an abort, an error)
and releases its pages; whether a token ends a request is ``Request.stop_reason``'s call.
"""

from __future__ import annotations

import time
from collections import deque
from typing import NamedTuple

from runtime.cache.manager import CacheManager
from runtime.request import Request, Status
from runtime.runner.forward_batch import SeqChunk, StepInput
from runtime.sampling.sampler import SampleResult

POLICIES = ("fcfs", "lpm")
LPM_MAX_QUEUE = 256  # matching every waiting request each step costs O(queue * prompt)


class Chunk(NamedTuple):
    """Tokens ``start:start+length`` of ``req`` computed this step; sampled when they end the sequence."""

    req: Request
    start: int
    length: int
    sample: bool


class Batch(NamedTuple):
    """One scheduled step: the chunks (for ``commit``) and the runner's input built from them."""

    chunks: list[Chunk]
    step: StepInput


class Sampled(NamedTuple):
    """A token ``commit`` appended to ``req``; whether it ends the request is ``Request.stop_reason``'s
    call, made by the engine once the token's text is known (stop strings)."""

    req: Request
    token: int


class SchedulerTotals(NamedTuple):
    """Token counters since start."""

    cached: int
    prefilled: int
    generated: int


class Scheduler:
    """Owns the waiting queue and the running set; decides each step and applies its result."""

    def __init__(
        self,
        cache: CacheManager,
        chunk_size: int,
        max_running: int,
        policy: str = "fcfs",
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"schedule policy must be one of {POLICIES}, got {policy!r}")
        self.cache = cache
        self.chunk_size = chunk_size
        self.max_running = max_running
        self.policy = policy
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_retractions = 0
        self._cached = self._prefilled = self._generated = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)
        self.cache.prefetch(req)  # a lower tier starts reading its pages while others compute

    def finish(self, req: Request, reason: str) -> None:
        """End ``req`` (stop, length, abort, error): drop it from the queues and release its pages.

        Idempotent: a finished request keeps its reason.
        """
        if req.status is Status.FINISHED:
            return
        req.finish_reason = reason
        req.finish_time = time.perf_counter()
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.cache.release(req)
        req.status = Status.FINISHED

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def totals(self) -> SchedulerTotals:
        return SchedulerTotals(self._cached, self._prefilled, self._generated)

    # -- choosing a step ----------------------------------------------------------------
    def schedule(self) -> Batch | None:
        """The next step's batch (pages reserved for every chunk), or None when nothing can run."""
        chunks: dict[Request, Chunk] = {}
        for req in list(self.running):
            # a prompt's 1-token tail is prefill, not a decode: it must come out of the chunk budget
            decoding = req.remaining == 1 and req.num_computed >= req.num_prompt
            if req not in self.running or not decoding:
                continue
            if self._reserve(req, 1, chunks):
                chunks[req] = Chunk(req, req.num_computed, 1, True)
            elif len(self.running) > 1:
                self._retract(req)  # the newest yields its pages (to the cache) so older ones progress
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
        now = time.perf_counter()
        while budget > 0 and self.waiting and len(self.running) < self.max_running:
            req = self.waiting[0]
            if self.cache.loading(req, wait=not self.running):
                break  # its pages are still being read: let the running requests step meanwhile
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
            if req.admitted_time is None:
                req.admitted_time = now
                self._cached += req.cached_tokens
            chunks[req] = Chunk(req, req.num_computed, n, n == req.remaining)
            budget -= n
        if not chunks:
            return None
        batch = list(chunks.values())
        sampled = [c.req for c in batch if c.sample]
        step = StepInput(
            seqs=[SeqChunk(c.req.tokens[c.start : c.start + c.length], c.start, c.req.pages) for c in batch],
            sample_mask=[c.sample for c in batch],
            params=[r.params for r in sampled],
            generators=[r.generator for r in sampled],
            states=self.cache.states.step_input([(c.req, c.start, c.length) for c in batch]),
            matchers=[r.matcher for r in sampled],
        )
        return Batch(batch, step)

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

    # -- applying a step ----------------------------------------------------------------
    def commit(self, batch: Batch, samples: SampleResult | None) -> list[Sampled]:
        """Advance every chunk's request, cache its computed pages, append sampled tokens (the engine then
        finishes those that stop: ``Request.stop_reason``)."""
        now = time.perf_counter()
        out: list[Sampled] = []
        row = 0
        for c in batch.chunks:
            req = c.req
            prompt_part = max(0, min(c.start + c.length, req.num_prompt) - c.start)
            req.prefilled_tokens += prompt_part
            self._prefilled += prompt_part
            req.num_computed += c.length
            if c.length > 1 or not c.sample:
                self.cache.cache_computed(req)  # share prompt pages with concurrent requests at once
            if not c.sample:
                continue
            assert samples is not None
            tok = req.params.forced_at(len(req.tokens) - req.num_prompt, samples.tokens[row])
            if req.params.logprobs is not None:
                req.logprobs.append((tok, samples.logprobs[row]))
            row += 1
            if req.first_token_time is None:
                req.first_token_time = now
            req.tokens.append(tok)
            if req.matcher is not None:
                req.matcher.advance(tok)
            self._generated += 1
            out.append(Sampled(req, tok))
        return out
