"""The offline engine: tokens in, tokens out, KV reused across requests.

``Engine.step`` is the whole loop body: drain the inbox (adds, aborts and calls from any
thread), let the scheduler pick a batch, run it (forward + sample), let the scheduler commit
the result (progress, cached pages, finished requests), detokenise, and return outputs.
``AsyncEngine`` runs it in a background thread; ``generate`` runs it inline.  Callers use the
methods and properties here, never the runner, cache manager or scheduler directly.
"""

from __future__ import annotations

import itertools
import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from runtime.cache_manager import CacheManager, CacheStats
from runtime.config import EngineConfig
from runtime.constrained import GrammarCompiler, GrammarError
from runtime.detokenizer import IncrementalDetokenizer
from runtime.distributed.launch import TPError
from runtime.hybrid_states import HybridStates
from runtime.kv_store.open import open_tiers
from runtime.model_runner import ModelRunner, default_dtype
from runtime.model_source import cache_dir, resolve_model
from runtime.outputs import make_output
from runtime.request import Request, RequestOutput
from runtime.sampler import SampleResult
from runtime.sampling import SamplingParams
from runtime.scheduler import Batch, Scheduler
from runtime.tokenizer import eos_token_ids, load_tokenizer

DEFAULT_SNAPSHOT_BYTES = 1 << 30


def hybrid_states(runner: ModelRunner, cfg: EngineConfig) -> tuple[HybridStates | None, int | None]:
    """A hybrid model's state slots, and the byte budget of the snapshots on the prefix cache's nodes
    (None for dense models; snapshots are taken only when a prefix cache keeps them)."""
    if runner.state_pool is None:
        return None, None
    budget = cfg.snapshot_memory if cfg.snapshot_memory is not None else DEFAULT_SNAPSHOT_BYTES
    keep = cfg.prefix_cache == "radix"
    return HybridStates(runner.state_pool, cfg.page_size, keep, cfg.snapshot_every), budget


class EngineError(ValueError):
    """A request the engine cannot serve; the message says why in one line, ``code`` says what kind
    (an OpenAI error code such as ``context_length_exceeded``, or None)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


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
    host_loaded_tokens: int = 0  # cached tokens loaded back from the host tier
    disk_loaded_tokens: int = 0  # cached tokens loaded back from the disk tier
    tier_load_s: float = 0.0  # time spent loading them
    host_tier_pages: int = 0
    disk_tier_pages: int = 0
    disk_tier_bytes: int = 0
    snapshots: int = 0  # hybrids: linear-attention state snapshots held now, their bytes, and
    snapshot_bytes: int = 0  # KV-matched tokens of finished requests recomputed for want of a snapshot
    snapshot_cut_tokens: int = 0


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
            tensor_parallel_size=cfg.tensor_parallel_size,
            state_slots=cfg.max_running,
            quantize=cfg.quantize,
        )
        self.dtype, self.device = dtype, self.runner.device
        self.tokenizer = load_tokenizer(self.model_dir)
        self.eos_ids = frozenset(eos_token_ids(self.model_dir, self.runner.cfg, self.tokenizer))
        mc = self.runner.cfg
        self.max_model_len = cfg.max_model_len or min(
            mc.max_position_embeddings, mc.sliding_window or 1 << 30
        )
        if (cfg.kv_store or cfg.kv_host_memory) and self.runner.state_pool is not None:
            raise EngineError("--kv-store / --kv-host-memory do not keep hybrid models' state snapshots yet")
        if (
            self.runner.device.type == "cuda"
            and self.runner.backend.name == "triton"
            and cfg.tensor_parallel_size == 1
            and self.runner.state_pool is None
        ):
            self.runner.enable_decode_graphs(self.max_model_len)  # decode is launch-bound on a GPU
        tiers = open_tiers(
            cfg.kv_store, cfg.kv_store_size, cfg.kv_host_memory, self.model_dir, dtype, cfg.page_size,
            pin=self.runner.device.type == "cuda", memo_dir=cache_dir() / "digests",
        )  # fmt: skip
        states, state_budget = hybrid_states(self.runner, cfg)
        self.cache = CacheManager(
            self.runner.pool.num_pages,
            cfg.page_size,
            cfg.prefix_cache,
            cfg.eviction_policy,
            cfg.session_ttl,
            cfg.pinned_fraction,
            tiers=tiers,
            io=self.runner.pool,
            write_through=cfg.kv_write_through,
            states=states,
            state_budget=state_budget,
        )
        self._next_persist = time.monotonic() + cfg.kv_store_sync_s
        self.scheduler = Scheduler(
            self.cache, cfg.chunk_size, cfg.max_running, cfg.schedule_policy, self.max_model_len
        )
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._requests: dict[str, Request] = {}
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._ids = itertools.count()
        self._seed_rng = torch.Generator().manual_seed(cfg.seed)
        self._totals = dict.fromkeys(("requests", "prompt", "snapshot_cut"), 0)
        self.grammars = GrammarCompiler(self.tokenizer, mc.vocab_size, self.eos_ids)  # compiles lazily

    # -- requests -----------------------------------------------------------------------
    def validate(self, prompt: str | list[int], params: SamplingParams) -> list[int]:
        """Tokenise and check a prompt (in the caller's thread); raises EngineError with a one-line reason.

        Side-effect free, so a server can reject a request before its response starts.
        """
        try:
            ids = (
                self.tokenizer.encode(prompt, add_special_tokens=False)
                if isinstance(prompt, str)
                else list(prompt)
            )
        except Exception as e:  # e.g. a lone surrogate: the tokenizer's TypeError is the caller's problem
            raise EngineError(f"the prompt cannot be tokenised: {e}".splitlines()[0][:300]) from None
        if not ids:
            raise EngineError("the prompt is empty")
        vocab = self.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise EngineError(f"prompt token ids must be in [0, {vocab})")
        if params.logit_bias and not all(0 <= t < vocab for t in params.logit_bias):
            raise EngineError(f"logit_bias token ids must be in [0, {vocab})")
        if params.grammar is not None:
            try:
                self.grammars.compiled(params.grammar)  # compiled once; later requests hit the cache
            except GrammarError as e:
                raise EngineError(str(e)) from None
        total = len(ids) + params.max_tokens
        if total > self.max_model_len:
            raise EngineError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds "
                f"the model's context length ({self.max_model_len} tokens)",
                "context_length_exceeded",
            )
        pool_tokens = self.kv_capacity_tokens
        if total > pool_tokens:
            raise EngineError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds the KV cache "
                f"({pool_tokens} tokens); raise --kv-cache-memory",
                "context_length_exceeded",
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
        if params.grammar is not None:
            req.matcher = self.grammars.matcher(params.grammar, params.max_tokens)
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
        """Validate, queue, and return the request's id (outputs come from :meth:`step`)."""
        req = self.make_request(prompt, params, request_id)
        self.submit(req)
        return req.request_id

    # -- the loop ---------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.scheduler.has_work() or not self._inbox.empty()

    def step(self) -> list[RequestOutput]:
        """inbox -> schedule -> forward + sample -> commit -> detokenise -> outputs."""
        outputs = self._drain_inbox()
        if self.cache.tiers is not None and time.monotonic() >= self._next_persist:
            self._next_persist = time.monotonic() + self.config.kv_store_sync_s
            self.cache.persist(wait=False)
        batch = self.scheduler.schedule()
        if batch is None:
            return outputs
        try:
            result = self.runner.step(batch.step)
            batch, samples, failed = _without_failed_rows(batch, result.samples)
            outputs += [self._fail(req, e) for req, e in failed]  # only those requests: the rest commit
            for s in self.scheduler.commit(batch, samples):
                outputs.append(self._emit(s.req, s.token, s.finish_reason))
        except TPError:  # a tensor-parallel rank is gone: no later step can run, the engine dies
            raise
        except Exception as e:  # a failed forward is not one request's: fail the batch, keep serving
            outputs += [self._fail(c.req, e) for c in batch.chunks if c.req.request_id in self._requests]
        return outputs

    def _fail(self, req: Request, e: Exception) -> RequestOutput:
        return self.finish_request(req, "error", error=f"{type(e).__name__}: {e}".splitlines()[0][:300])

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
                outs.append(self.finish_request(req, "abort"))
        return outs

    def _emit(self, req: Request, tok: int, reason: str | None) -> RequestOutput:
        """Detokenise a committed token; a stop string ends the request here."""
        detok = self._detok[req.request_id]
        delta = detok.add(tok)
        if detok.stopped:
            reason = "stop"
        if reason is None:
            return make_output(req, detok, delta, 1)
        return self.finish_request(req, reason, delta, new_tokens=1)

    def finish_request(
        self, req: Request, reason: str, delta: str = "", new_tokens: int = 0, error: str | None = None
    ) -> RequestOutput:
        """End ``req`` now (between steps: a stop, an abort, or ``reason="error"`` with ``error``), freeing
        its pages; returns its final output."""
        self.scheduler.finish(req, reason)
        self._totals["snapshot_cut"] += req.snapshot_cut
        detok = self._detok.pop(req.request_id)
        self._requests.pop(req.request_id, None)
        return make_output(req, detok, delta + detok.flush(), new_tokens, error)

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

    # -- the public surface for servers and benchmarks ------------------------------------------
    @property
    def page_size(self) -> int:
        return self.cache.page_size

    @property
    def snapshot_policy(self) -> tuple[int, int, int] | None:
        """A hybrid's snapshot placement ``(page_size, chunk_size, every_pages)`` (runtime/hybrid_states.py);
        None for dense models or without a prefix cache."""
        cfg = self.config
        if self.runner.state_pool is None or cfg.prefix_cache != "radix":
            return None
        return cfg.page_size, cfg.chunk_size, cfg.snapshot_every

    @property
    def vocab_size(self) -> int:
        return self.runner.cfg.vocab_size

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the KV pool holds: the most one request can use, whatever is cached."""
        return self.runner.pool.num_tokens

    @property
    def token_capacity(self) -> int:
        """The most tokens (prompt + output) one request can have: context length and KV pool both."""
        return min(self.max_model_len, self.kv_capacity_tokens)

    def call_between_steps(self, fn: Callable[[], object]) -> None:
        """Thread-safe: run ``fn()`` on the engine's thread before the next step (e.g. a cache reset)."""
        self._inbox.put(("call", fn))

    def stats(self) -> EngineStats:
        cs = self.cache.stats()
        t, st = self._totals, self.scheduler.totals
        return EngineStats(
            requests=t["requests"], prompt_tokens=t["prompt"], cached_tokens=st.cached,
            prefilled_tokens=st.prefilled, generated_tokens=st.generated, evicted_pages=cs.evicted_pages,
            retractions=self.scheduler.num_retractions, running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting), total_pages=cs.total_pages, free_pages=cs.free_pages,
            tree_pages=cs.tree_pages, request_pages=cs.request_pages, page_size=self.cache.page_size,
            **self._tier_fields(),
            **self._snapshot_stats(),
        )  # fmt: skip

    def _tier_fields(self) -> dict:
        ts = self.cache.tier_stats()
        if ts is None:
            return {}
        ps = self.page_size
        return dict(
            host_loaded_tokens=ts.loaded_host_pages * ps, disk_loaded_tokens=ts.loaded_disk_pages * ps,
            tier_load_s=ts.load_seconds, host_tier_pages=ts.host_pages, disk_tier_pages=ts.disk_pages,
            disk_tier_bytes=ts.disk_bytes,
        )  # fmt: skip

    def _snapshot_stats(self) -> dict[str, int]:
        ps = self.cache.prefix.stats()
        return dict(
            snapshots=ps.states,
            snapshot_bytes=ps.state_bytes,
            snapshot_cut_tokens=self._totals["snapshot_cut"],
        )

    def check_integrity(self) -> CacheStats:
        """Every page is free, cached, or one request's own; raises AssertionError on a leak."""
        return self.cache.check_integrity()

    def persist_cache(self) -> int:
        """Write every cached page that is only in the pool to the disk tier (``--kv-store``); returns pages."""
        return self.cache.persist()

    def load_cache(self) -> int:
        """Load what the disk tier (``--kv-store``) holds into the pool, as far as free pages allow
        (only between steps); returns tokens loaded.  Matches load lazily anyway: this prewarms."""
        return self.cache.load_stored()

    def close(self) -> None:
        """Persist the cache to the disk tier, release the store (its lock) and stop the other
        tensor-parallel ranks; idempotent."""
        self.cache.close()
        self.runner.close()

    def tier_stats(self):
        """Lower-tier counters (``runtime.kv_store.tiers.TierStats``), or None without tiers."""
        return self.cache.tier_stats()

    def reset_prefix_cache(self) -> None:
        """Drop every cached page (only when idle)."""
        if self.scheduler.running:
            raise EngineError("cannot reset the prefix cache while requests are running")
        self.cache.reset()


def _without_failed_rows(
    batch: Batch, samples: SampleResult | None
) -> tuple[Batch, SampleResult | None, list[tuple[Request, Exception]]]:
    """The batch and samples without the requests whose sampling failed, and those requests."""
    if samples is None or not samples.errors:
        return batch, samples, []
    sampled = [c for c in batch.chunks if c.sample]
    failed = [(sampled[r].req, e) for r, e in samples.errors.items()]
    keep = [r for r in range(len(sampled)) if r not in samples.errors]
    bad = {id(req) for req, _ in failed}
    chunks = [c for c in batch.chunks if id(c.req) not in bad]
    kept = SampleResult([samples.tokens[r] for r in keep], [samples.logprobs[r] for r in keep])
    return batch._replace(chunks=chunks), kept, failed
