"""The offline engine: tokens in, tokens out, KV reused across requests.

``Engine.step`` is the whole loop body: drain the inbox (adds, aborts from any thread),
schedule a flat batch, run it, sample, detokenise, finish.  ``AsyncEngine`` runs it in a
background thread; ``generate`` runs it inline.
"""

from __future__ import annotations

import itertools
import queue
import time
from pathlib import Path
from typing import NamedTuple

import torch

from runtime.cache_manager import CacheManager
from runtime.config import EngineConfig
from runtime.detokenizer import IncrementalDetokenizer
from runtime.model_runner import ModelRunner, default_dtype
from runtime.model_source import resolve_model
from runtime.outputs import make_output
from runtime.request import Request, RequestOutput, Status
from runtime.sampling import SamplingParams
from runtime.scheduler import Chunk, Scheduler
from runtime.tokenizer import eos_token_ids, load_tokenizer


class EngineError(ValueError):
    """A request the engine cannot serve; the message says why in one line."""


class EngineStats(NamedTuple):
    """Totals since start (counters) and the pool right now (gauges)."""

    requests: int
    prompt_tokens: int
    cached_tokens: int
    prefilled_tokens: int
    generated_tokens: int
    evicted_pages: int
    retractions: int
    running: int
    waiting: int
    total_pages: int
    free_pages: int
    tree_pages: int
    request_pages: int
    page_size: int


class Engine:
    """Runs one model with a paged KV pool and a radix prefix cache (or none: ``prefix_cache="off"``)."""

    def __init__(self, model: str | None = None, **options) -> None:
        self.config = cfg = EngineConfig(model=model, **options)
        self.model_dir, self.model_name = (
            resolve_model(model) if cfg.model_dir is None else (Path(cfg.model_dir), str(cfg.model_dir))
        )
        device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = cfg.dtype or default_dtype(torch.device(device))
        self.runner = ModelRunner(
            self.model_dir,
            dtype,
            device,
            cfg.page_size,
            cfg.kv_cache_memory,
            cfg.num_pages,
            cfg.attention_backend,
        )
        self.dtype, self.device = dtype, self.runner.device
        self.tokenizer = load_tokenizer(self.model_dir)
        self.eos_ids = frozenset(eos_token_ids(self.model_dir, self.runner.cfg, self.tokenizer))
        mc = self.runner.cfg
        self.max_model_len = cfg.max_model_len or min(
            mc.max_position_embeddings, mc.sliding_window or 1 << 30
        )
        self.cache = CacheManager(self.runner.pool.num_pages, cfg.page_size, cfg.prefix_cache)
        self.scheduler = Scheduler(self.cache, cfg.chunk_size, cfg.max_running, cfg.schedule_policy)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._requests: dict[str, Request] = {}
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._ids = itertools.count()
        self._seed_rng = torch.Generator().manual_seed(cfg.seed)
        self._totals = dict.fromkeys(("requests", "prompt", "cached", "prefilled", "generated"), 0)
        self.record_logits = cfg.record_logits

    # -- requests -----------------------------------------------------------------------
    def validate(self, prompt: str | list[int], params: SamplingParams) -> list[int]:
        """Tokenise and check a prompt (in the caller's thread); raises EngineError with a one-line reason.

        Side-effect free, so a server can reject a request before its response starts.
        """
        ids = (
            self.tokenizer.encode(prompt, add_special_tokens=False)
            if isinstance(prompt, str)
            else list(prompt)
        )
        if not ids:
            raise EngineError("the prompt is empty")
        vocab = self.runner.cfg.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise EngineError(f"prompt token ids must be in [0, {vocab})")
        total = len(ids) + params.max_tokens
        if total > self.max_model_len:
            raise EngineError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds "
                f"the model's context length ({self.max_model_len} tokens)"
            )
        pool_tokens = self.runner.pool.num_tokens
        if total > pool_tokens:
            raise EngineError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds the KV cache "
                f"({pool_tokens} tokens); raise --kv-cache-memory"
            )
        return ids

    def make_request(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> Request:
        """A validated request, its sampling generator seeded; raises EngineError like :meth:`validate`."""
        ids = self.validate(prompt, params)
        gen = None
        if not params.greedy:
            seed = (
                params.seed
                if params.seed is not None
                else int(torch.randint(0, 2**62, (1,), generator=self._seed_rng))
            )
            gen = torch.Generator().manual_seed(seed)
        rid = request_id or f"req-{next(self._ids)}"
        req = Request(rid, ids, len(ids), params, self.eos_ids, generator=gen)
        req.logits_trace = [] if self.record_logits else None
        return req

    def submit(self, req: Request) -> None:
        """Thread-safe: queue a request for the next step."""
        self._inbox.put(("add", req))

    def abort(self, request_id: str) -> None:
        """Thread-safe: cancel a request; its pages are freed at the next step."""
        self._inbox.put(("abort", request_id))

    def add_request(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> str:
        req = self.make_request(prompt, params, request_id)
        self.submit(req)
        return req.request_id

    # -- the loop ---------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.scheduler.has_work() or not self._inbox.empty()

    def step(self) -> list[RequestOutput]:
        outputs = self._drain_inbox()
        chunks = self.scheduler.schedule()
        if not chunks:
            return outputs
        now = time.perf_counter()
        for c in chunks:
            if c.req.admitted_time is None:
                c.req.admitted_time = now
                self._totals["cached"] += c.req.cached_tokens
        logits, samples = self.runner.step(chunks)
        outputs += self._postprocess(chunks, logits, samples)
        return outputs

    def _drain_inbox(self) -> list[RequestOutput]:
        outs = []
        while not self._inbox.empty():
            kind, item = self._inbox.get()
            if kind == "add":
                self._requests[item.request_id] = item
                self._detok[item.request_id] = IncrementalDetokenizer(self.tokenizer, item.params.stop)
                self._totals["requests"] += 1
                self._totals["prompt"] += item.num_prompt
                self.scheduler.add(item)
            elif kind == "call":
                item()
            elif (req := self._requests.get(item)) is not None:
                outs.append(self._finish(req, "abort"))
        return outs

    def _postprocess(self, chunks: list[Chunk], logits: torch.Tensor, samples) -> list[RequestOutput]:
        now = time.perf_counter()
        outs: list[RequestOutput] = []
        row = 0
        for c in chunks:
            req = c.req
            prompt_part = max(0, min(c.start + c.length, req.num_prompt) - c.start)
            req.prefilled_tokens += prompt_part
            self._totals["prefilled"] += prompt_part
            req.num_computed += c.length
            if c.length > 1 or not c.sample:
                self.cache.cache_computed(req)  # share prompt pages with concurrent requests at once
            if not c.sample:
                continue
            if req.logits_trace is not None:
                req.logits_trace.append(logits[row].cpu())
            tok = req.params.forced_at(len(req.output_ids), samples.tokens[row])
            if req.params.logprobs is not None:
                req.logprobs.append((tok, samples.logprobs[row]))
            row += 1
            if req.first_token_time is None:
                req.first_token_time = now
            req.tokens.append(tok)
            self._totals["generated"] += 1
            delta = self._detok[req.request_id].add(tok)
            reason = self._stop_reason(req, tok)
            outs.append(
                self._finish(req, reason, delta)
                if reason
                else make_output(req, self._detok[req.request_id], delta)
            )
        return outs

    def _stop_reason(self, req: Request, tok: int) -> str | None:
        p = req.params
        if (
            (tok in req.eos_ids and not p.ignore_eos)
            or tok in p.stop_token_ids
            or self._detok[req.request_id].stopped
        ):
            return "stop"
        if len(req.output_ids) >= p.max_tokens or len(req.tokens) >= self.max_model_len:
            return "length"
        return None

    def _finish(self, req: Request, reason: str, delta: str = "") -> RequestOutput:
        req.finish_reason = reason
        req.finish_time = time.perf_counter()
        if req.status is not Status.FINISHED:
            self.scheduler.remove(req)
        detok = self._detok.pop(req.request_id)
        self._requests.pop(req.request_id, None)
        return make_output(req, detok, delta + detok.flush())

    # -- conveniences -------------------------------------------------------------------
    def generate(
        self,
        prompts: str | list[int] | list[str] | list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion (batched together); outputs in input order."""
        single = isinstance(prompts, str) or (bool(prompts) and isinstance(prompts[0], int))
        plist = [prompts] if single else list(prompts)
        params = params or SamplingParams()
        plist_params = params if isinstance(params, list) else [params] * len(plist)
        reqs = [self.make_request(p, sp) for p, sp in zip(plist, plist_params)]
        for r in reqs:
            self.submit(r)
        done: dict[str, RequestOutput] = {}
        while len(done) < len(reqs):
            for out in self.step():
                if out.finished:
                    done[out.request_id] = out
        return [done[r.request_id] for r in reqs]

    def stats(self) -> EngineStats:
        cs = self.cache.stats()
        t = self._totals
        return EngineStats(
            requests=t["requests"], prompt_tokens=t["prompt"], cached_tokens=t["cached"],
            prefilled_tokens=t["prefilled"], generated_tokens=t["generated"], evicted_pages=cs.evicted_pages,
            retractions=self.scheduler.num_retractions, running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting), total_pages=cs.total_pages, free_pages=cs.free_pages,
            tree_pages=cs.tree_pages, request_pages=cs.request_pages, page_size=self.cache.page_size,
        )  # fmt: skip

    def check_integrity(self):
        return self.cache.check_integrity()

    def reset_prefix_cache(self) -> None:
        """Drop every cached page (only when idle)."""
        if self.scheduler.running:
            raise EngineError("cannot reset the prefix cache while requests are running")
        self.cache.reset()
