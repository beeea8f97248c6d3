"""Continuous batching with chunked prefill; the scheduler owns every request's life.

``schedule()`` picks a step: every running request that needs one token (a decode), then a
prefill budget of ``chunk_size`` tokens (while more than one tenant has work, or had within
``TENANT_LINGER_S``, at most ``tenant_chunk_size`` and what fits a step of ``tenant_step_s``) with the next chunks of partly prefilled requests and
newly admitted ones (a tenant with nothing running first), so a long prompt delays running decodes
by at most one chunk.  When pages
run out, the newest running request is retracted: its computed pages go to the prefix cache, it
returns to the front of the queue with its output so far, and is later re-prefilled (mostly from
the cache).  ``commit()`` applies the step's result: progress, page insertion and sampled
tokens.  A decoding request may also verify a draft (``runtime/speculative``): its chunk is its
last token plus the drafted ones, and ``commit`` keeps the accepted part and frees the pages of the
rest (and rolls a hybrid's linear-attention state back to the last accepted token).  ``finish()`` ends a request (a stop, ``length``, an abort, an error)
and releases its pages; whether a token ends a request is ``Request.stop_reason``'s call.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from typing import NamedTuple

from kvreuse.runtime.cache.manager import CacheManager
from kvreuse.runtime.request import Request, Status
from kvreuse.runtime.runner.forward_batch import SeqChunk, StepInput
from kvreuse.runtime.sampling.sampler import SampleResult
from kvreuse.runtime.speculative.drafter import NoDrafts, PromptLookup

POLICIES = ("fcfs", "lpm")
LPM_MAX_QUEUE = 256  # matching every waiting request each step costs O(queue * prompt)
# A tenant whose request just ended counts as active this long: an agent or a chat client sends its
# next request after an answer and a pause (a tool call, a person reading), and the step already
# running when it arrives must be a short one.  At 2 s, the fairness benchmark's victim, back after a
# 3 s pause, waited out another tenant's whole 512-token step (its slowest request); the cost of a
# long linger is only that a long prompt prefills in short chunks while another tenant is about.
TENANT_LINGER_S = 30.0


MIN_TENANT_CHUNK = 16  # a time budget never starves a prompt: at least this many tokens a step


class StepClock:
    """A step's seconds as a line in its tokens, ``a + b * tokens``, fitted by least squares to the
    last ``keep`` steps (timed from ``schedule`` to ``commit``: the forward and the sampling).

    It turns the tenant step budget, a time, into tokens on whatever machine and load the engine
    runs: a fixed token budget stalls another tenant by 0.3 s on one machine and 1.2 s on a busier
    one (benchmarks/serving/fairness.py).  The fixed cost ``a`` is what a step of a few tokens costs anyway.
    """

    def __init__(self, keep: int = 64) -> None:
        self._steps: deque[tuple[int, float]] = deque(maxlen=keep)

    def observe(self, tokens: int, seconds: float) -> None:
        self._steps.append((tokens, seconds))

    def tokens_within(self, seconds: float) -> int | None:
        """Tokens a step can take and still end within ``seconds``; None before enough steps were seen."""
        if len(self._steps) < 4:
            return None
        ns, ts = zip(*self._steps)
        mn, mt = sum(ns) / len(ns), sum(ts) / len(ts)
        var = sum((n - mn) ** 2 for n in ns)
        b = sum((n - mn) * (t - mt) for n, t in zip(ns, ts)) / var if var else 0.0
        if b <= 0:  # one step size seen (or noise): the cost per token, fixed part included
            a, b = 0.0, mt / max(mn, 1.0)
        else:
            a = mt - b * mn
        return max(0, int((seconds - a) / b)) if b > 0 else None


class Chunk(NamedTuple):
    """Tokens ``start:start+length`` of ``req`` computed this step; sampled when they end the sequence.
    ``draft``: tokens proposed after them, computed and verified in the same forward."""

    req: Request
    start: int
    length: int
    sample: bool
    draft: tuple[int, ...] = ()


class Batch(NamedTuple):
    """One scheduled step: the chunks (for ``commit``) and the runner's input built from them."""

    chunks: list[Chunk]
    step: StepInput


class Sampled(NamedTuple):
    """The tokens ``commit`` appended to ``req`` (one, or an accepted draft and the token after it);
    whether one ends the request is ``Request.stop_reason``'s call, made by the engine once its text is
    known (stop strings); it cuts the rest off with ``Scheduler.cut_output``."""

    req: Request
    tokens: list[int]


class SchedulerTotals(NamedTuple):
    """Token counters since start."""

    cached: int
    prefilled: int
    generated: int
    drafted: int = 0  # speculative decoding: tokens drafted and verified
    accepted: int = 0  # of those, accepted
    # of ``cached``: loaded from the host / disk / shared tier, each request's hit counted once (a
    # failed admission or a retraction may load the same pages again: not a new hit)
    cached_host: int = 0
    cached_disk: int = 0
    cached_shared: int = 0


class Scheduler:
    """Owns the waiting queue and the running set; decides each step and applies its result."""

    def __init__(
        self,
        cache: CacheManager,
        chunk_size: int,
        max_running: int,
        policy: str = "fcfs",
        drafter: NoDrafts | PromptLookup | None = None,
        tenant_chunk_size: int | None = None,
        tenant_linger_s: float = TENANT_LINGER_S,
        tenant_step_s: float | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"schedule policy must be one of {POLICIES}, got {policy!r}")
        self.cache = cache
        self.chunk_size = chunk_size
        self.tenant_chunk_size = tenant_chunk_size or chunk_size
        self.tenant_linger_s = tenant_linger_s
        self.tenant_step_s = tenant_step_s
        self.clock = StepClock()
        self._scheduled: tuple[int, float] | None = None  # the step handed out: (tokens, when)
        self._last_seen: dict = {}  # tenant namespace -> when a request of it last arrived or ended
        self.max_running = max_running
        self.policy = policy
        self.drafter = drafter if drafter is not None else NoDrafts()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_retractions = 0
        self._cached = self._prefilled = self._generated = 0
        self._cached_tiers = [0, 0, 0]  # host, disk, shared
        self._drafted = self._accepted = 0

    def add(self, req: Request) -> None:
        self._last_seen[req.scope.namespace] = time.perf_counter()
        self.waiting.append(req)
        self.cache.prefetch(req)  # a lower tier starts reading its pages while others compute

    def finish(self, req: Request, reason: str) -> None:
        """End ``req`` (stop, length, abort, error): drop it from the queues and release its pages.

        Idempotent: a finished request keeps its reason.
        """
        if req.status is Status.FINISHED:
            return
        req.finish_reason = reason
        req.finish_time = self._last_seen[req.scope.namespace] = time.perf_counter()
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.cache.finish(req)
        req.status = Status.FINISHED
        self.drafter.finish(req, req.tokens, req.scope.namespace)

    def cut_output(self, req: Request, n: int) -> None:
        """Drop the last ``n`` tokens ``commit`` appended (they came after the one that stopped ``req``)."""
        req.drop_tail(n)
        self._generated -= n

    def forget_tenants(self) -> None:
        """Forget which tenants were seen lately: only those with work count for the next step's budget
        (a benchmark's rounds start afresh rather than waiting ``tenant_linger_s``)."""
        self._last_seen.clear()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def totals(self) -> SchedulerTotals:
        return SchedulerTotals(self._cached, self._prefilled, self._generated, self._drafted, self._accepted,
                               *self._cached_tiers)  # fmt: skip

    # -- choosing a step ----------------------------------------------------------------
    def schedule(self) -> Batch | None:
        """The next step's batch (pages reserved for every chunk), or None when nothing can run."""
        self.cache.tick()  # the disk tier's persist clock
        chunks: dict[Request, Chunk] = {}
        for req in list(self.running):
            # a prompt's 1-token tail is prefill, not a decode: it must come out of the chunk budget
            decoding = req.remaining == 1 and req.num_computed >= req.num_prompt
            if req not in self.running or not decoding:
                continue
            draft = self._draft(req)
            if draft and self.cache.reserve(req, 1 + len(draft)):  # a draft never retracts anyone
                chunks[req] = Chunk(req, req.num_computed, 1, True, tuple(draft))
            elif self._reserve(req, 1, chunks):
                chunks[req] = Chunk(req, req.num_computed, 1, True)
            elif len(self.running) > 1:
                self._retract(req)  # the newest yields its pages (to the cache) so older ones progress
        budget = self._budget(len(chunks))
        for req in self._new_tenants():  # before other tenants' running prefills: see _new_tenants
            if budget <= 0 or len(self.running) >= self.max_running:
                break
            taken = self._admit(req, budget, chunks)
            if taken is None:
                break
            budget -= taken
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
            taken = self._admit(self.waiting[0], budget, chunks)
            if taken is None:
                break
            budget -= taken
        if not chunks:
            return None
        batch = list(chunks.values())
        sampled = [c.req for c in batch if c.sample]
        drafting = any(c.draft for c in batch)
        step = StepInput(
            seqs=[
                SeqChunk(c.req.tokens[c.start : c.start + c.length] + list(c.draft), c.start, c.req.pages)
                for c in batch
            ],
            sample_mask=[c.sample and 1 + len(c.draft) for c in batch]
            if drafting
            else [c.sample for c in batch],
            params=[r.params for r in sampled],
            draws=[r.draws.at(len(r.output_ids)) if r.draws is not None else None for r in sampled],
            states=self.cache.state_input(
                [(c.req, c.start, c.length) for c in batch],
                [len(c.draft) for c in batch] if drafting else None,
            ),
            matchers=[r.matcher for r in sampled],
            drafts=[list(c.draft) for c in batch if c.sample] if drafting else None,
        )
        self._scheduled = (sum(c.length + len(c.draft) for c in batch), time.perf_counter())
        return Batch(batch, step)

    def _budget(self, rows: int) -> int:
        """The step's prefill tokens: ``chunk_size``, or while more than one tenant has work or had within
        ``tenant_linger_s`` at most ``tenant_chunk_size`` and what ``clock`` says fits ``tenant_step_s``
        beside the step's ``rows`` decodes (never under ``MIN_TENANT_CHUNK``), so one tenant's long
        prompt stalls another's request by a short step rather than a long one (prefill throughput per
        step is only spent on fairness when there is another tenant to be fair to)."""
        now = time.perf_counter()
        self._last_seen = {ns: t for ns, t in self._last_seen.items() if now - t <= self.tenant_linger_s}
        tenants = set(self._last_seen)
        for req in itertools.chain(self.running, self.waiting):  # stops at the second tenant
            if len(tenants) > 1:
                break
            tenants.add(req.scope.namespace)
        if len(tenants) <= 1:
            return self.chunk_size
        fits = self.clock.tokens_within(self.tenant_step_s) if self.tenant_step_s is not None else None
        timed = self.tenant_chunk_size if fits is None else max(MIN_TENANT_CHUNK, fits - rows)
        return min(self.chunk_size, self.tenant_chunk_size, timed)

    def _new_tenants(self) -> list[Request]:
        """The first waiting request of each tenant that has nothing running: admitted before the
        running prefills take the budget, so a tenant's one-line request is not queued behind the rest
        of another tenant's long prompt.  Without tenants (one namespace) the queue order stands."""
        running = {r.scope.namespace for r in self.running}
        if not running:
            return []
        first: dict = {}
        for req in self.waiting:
            if req.scope.namespace not in running and req.scope.namespace not in first:
                first[req.scope.namespace] = req
        return list(first.values())

    def _admit(self, req: Request, budget: int, chunks: dict[Request, Chunk]) -> int | None:
        """Move waiting ``req`` to running with a first chunk of at most ``budget`` tokens; the tokens it
        took, or None when it cannot start yet (pages still loading or not reservable)."""
        if self.cache.loading(req, wait=not self.running):
            return None  # its pages are still being read: let the running requests step meanwhile
        self.cache.admit(req)
        n = min(req.remaining, budget)
        if not self.cache.reserve(req, n):
            self.cache.release(req, cache=False)
            if req.retractions == 0:
                req.cached_tokens = -1  # measured again when it is really admitted
            return None
        self.waiting.remove(req)
        req.status = Status.RUNNING
        self.running.append(req)
        if req.admitted_time is None:
            req.admitted_time = time.perf_counter()
            self._cached += req.cached_tokens
            tiers = (req.cached_host_tokens, req.cached_disk_tokens, req.cached_shared_tokens)
            self._cached_tiers = [a + b for a, b in zip(self._cached_tiers, tiers)]
        chunks[req] = Chunk(req, req.num_computed, n, n == req.remaining)
        return n

    def _draft(self, req: Request) -> list[int]:
        """Tokens to verify after ``req``'s last one: never past ``max_tokens``, never under a grammar
        (its mask would have to advance through tokens not yet accepted)."""
        limit = req.params.max_tokens - (len(req.tokens) - req.num_prompt) - 1
        if limit <= 0 or req.matcher is not None:
            return []
        return self.drafter.propose(req, req.tokens, req.scope.namespace, limit)

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
        if self._scheduled is not None:
            self.clock.observe(self._scheduled[0], now - self._scheduled[1])
            self._scheduled = None
        out: list[Sampled] = []
        verified: dict[Request, int] = {}  # drafted tokens accepted, per request that verified a draft
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
            targets = [(samples.tokens[row], samples.logprobs[row])]
            if samples.verified is not None:
                targets += samples.verified[row]
            row += 1
            if req.first_token_time is None:
                req.first_token_time = now
            toks = self._append(req, c.draft, targets)
            if c.draft:
                accepted = len(toks) - 1
                req.num_computed += accepted  # the accepted drafts' KV stands; the rest is cut off
                req.drafted_tokens += len(c.draft)
                req.accepted_tokens += accepted
                self._drafted += len(c.draft)
                self._accepted += accepted
                self.drafter.observe(req, len(c.draft), accepted)
                self.cache.trim(req)
                verified[req] = accepted
            out.append(Sampled(req, toks))
        if verified:  # a hybrid's linear-attention state back to each one's last accepted token
            self.cache.settle(verified)
        return out

    def _append(self, req: Request, draft: tuple[int, ...], targets: list) -> list[int]:
        """Append the target tokens up to and including the first that differs from the draft."""
        toks = []
        for j, (target, lp) in enumerate(targets):
            tok = req.params.forced_at(len(req.tokens) - req.num_prompt, target)
            if req.params.logprobs is not None:
                req.logprobs.append((tok, lp))
            req.tokens.append(tok)
            if req.matcher is not None:
                req.matcher.advance(tok)
            toks.append(tok)
            if j >= len(draft) or tok != draft[j]:
                break
        self._generated += len(toks)
        return toks
