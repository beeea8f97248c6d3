"""The offline engine: tokens in, tokens out, KV reused across requests.

``Engine.step`` is the whole loop body: drain the inbox (adds, aborts and calls from any
thread), let the scheduler pick a batch, run it (forward + sample), let the scheduler commit
the result (progress, cached pages, finished requests), detokenise, and return outputs.
``AsyncEngine`` runs it in a background thread; ``generate`` runs it inline.  Callers use the
methods and properties here and the cache manager's public methods (``Engine.cache``), never the
runner or the scheduler directly, nor the cache manager's parts (``tests/test_cache_wall.py``).
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from pathlib import Path

import torch

from kvreuse.runtime.cache.manager import CacheManager, CacheStats
from kvreuse.runtime.cache.pins import PinInfo
from kvreuse.runtime.cache.registry import cache_kind
from kvreuse.runtime.cache.store.open import open_tiers
from kvreuse.runtime.engine import states as model_states
from kvreuse.runtime.engine.admission import Admission, EngineError
from kvreuse.runtime.engine.config import EngineConfig
from kvreuse.runtime.engine.detokenizer import IncrementalDetokenizer
from kvreuse.runtime.engine.outputs import RequestOutput, make_output
from kvreuse.runtime.engine.scoring import Entry, prompt_logprobs
from kvreuse.runtime.engine.stats import EngineStats, engine_stats
from kvreuse.runtime.loading.model_source import cache_dir, resolve_model
from kvreuse.runtime.loading.tokenizer import eos_token_ids, load_tokenizer
from kvreuse.runtime.request import PUBLIC, CacheScope, Request
from kvreuse.runtime.runner.distributed.launch import TPError
from kvreuse.runtime.runner.model_runner import ModelRunner, default_dtype
from kvreuse.runtime.sampling.constrained import GrammarCompiler
from kvreuse.runtime.sampling.params import SamplingParams
from kvreuse.runtime.sampling.sampler import SampleResult
from kvreuse.runtime.scheduler import Batch, Scheduler
from kvreuse.runtime.speculative.drafter import make_drafter


class Engine:
    """Runs one model with a paged KV pool and a prefix cache of ``--prefix-cache``'s kind (``runtime/cache/registry.py``)."""

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
            compile_decode=cfg.compile_decode,
            chunk_size=cfg.chunk_size,
            window_paging=cfg.window_paging,
        )
        self.dtype, self.device = dtype, self.runner.device
        self.tokenizer = load_tokenizer(self.model_dir)
        self.eos_ids = frozenset(eos_token_ids(self.model_dir, self.runner.cfg, self.tokenizer))
        mc = self.runner.cfg
        model_len = mc.max_position_embeddings  # a sliding window limits what a layer sees, not the context
        if cfg.max_model_len is not None and cfg.max_model_len > model_len:  # positions past it have no rope
            raise EngineError(
                f"--max-model-len {cfg.max_model_len} exceeds the model's context length ({model_len} tokens)"
            )
        self.max_model_len = cfg.max_model_len or model_len
        model_states.check_state_support(self.runner, cfg)
        self.runner.choose_decode(self.max_model_len)
        tiers = open_tiers(
            cfg.kv_store, model_states.store_budgets(self.runner, cfg)[0], cfg.kv_host_memory, self.model_dir, dtype, cfg.page_size,
            pin=self.runner.device.type == "cuda", memo_dir=cache_dir() / "digests",
            settings={"quantize": cfg.quantize, "tensor_parallel_size": cfg.tensor_parallel_size},
            shared_url=cfg.kv_shared_store, shared_secret=cfg.shared_secret(),
        )  # fmt: skip
        states, state_budget = model_states.state_slots(self.runner, cfg)
        state_tier = model_states.snapshot_tier(self.runner, cfg) if tiers is not None else None
        self.cache = CacheManager(
            self.runner.pool.num_pages, cfg.page_size, cfg.prefix_cache, cfg.eviction_policy, cfg.session_ttl,
            cfg.pinned_fraction, tiers=tiers, io=self.runner.pool, write_through=cfg.kv_write_through, states=states,
            state_budget=state_budget, state_tier=state_tier, shadows=cfg.eviction_shadows, chunk_size=cfg.chunk_size,
            persist_every_s=cfg.kv_store_sync_s,
        )  # fmt: skip
        self.scheduler = Scheduler(
            self.cache, cfg.chunk_size, cfg.max_running, cfg.schedule_policy,
            make_drafter(model_states.speculative_mode(self.runner, cfg)), cfg.tenant_chunk_size,
            tenant_step_s=cfg.tenant_step_s,
        )  # fmt: skip
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._requests: dict[str, Request] = {}
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._totals = dict.fromkeys(("requests", "prompt", "snapshot_cut"), 0)
        self._closed = False
        self.grammars = GrammarCompiler(  # compiles lazily
            self.tokenizer, mc.vocab_size, self.eos_ids, cfg.grammar_compile_timeout
        )
        self.admission = Admission(
            self.tokenizer, mc.vocab_size, self.max_model_len, self.runner.pool.num_tokens,
            self.eos_ids, self.grammars, cfg.seed,
        )  # fmt: skip

    # -- requests -----------------------------------------------------------------------
    def make_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        scope: CacheScope = PUBLIC,
    ) -> Request:
        """Tokenise and check a prompt (in the caller's thread) and build its request, complete (cache
        ``scope`` included); raises EngineError with a one-line reason.  Nothing is queued until
        :meth:`submit`, so a server can refuse a request before its response starts."""
        return self.admission.make(prompt, params, request_id, scope)

    def submit(self, req: Request) -> None:
        """Thread-safe: queue a request for the next step."""
        if self._closed:
            raise EngineError("the engine is closed")
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
        if self._closed:  # its store is released and its ranks are gone: nothing may run on them
            raise EngineError("the engine is closed")
        outputs = self._drain_inbox()
        self.cache.tick()  # the disk tier's persist clock
        batch = self.scheduler.schedule()
        if batch is None:
            return outputs
        try:
            result = self.runner.step(batch.step)
            batch, samples, failed = _without_failed_rows(batch, result.samples)
            outputs += [self._fail(req, e) for req, e in failed]  # only those requests: the rest commit
            for s in self.scheduler.commit(batch, samples):
                outputs.append(self._emit(s.req, s.tokens))
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

    def _emit(self, req: Request, toks: list[int]) -> RequestOutput:
        """Detokenise a step's committed tokens and end the request at the first that stops it
        (``Request.stop_reason``); tokens after that one are dropped."""
        detok = self._detok[req.request_id]
        delta = ""
        for i, tok in enumerate(toks):
            delta += detok.add(tok)
            after = len(toks) - 1 - i
            reason = req.stop_reason(tok, detok.stopped, after)
            if reason is not None:
                self.scheduler.cut_output(req, after)
                return self.finish_request(req, reason, delta, new_tokens=i + 1)
        return make_output(req, detok, delta, len(toks))

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
        """A hybrid's snapshot placement ``(page_size, chunk_size, every_pages)`` (runtime/cache/state_slots.py);
        None for dense models or without a prefix cache."""
        cfg = self.config
        if not self.runner.state_pool.keeps_snapshots or not self.caches_prefixes:
            return None
        return cfg.page_size, cfg.chunk_size, cfg.snapshot_every

    @property
    def caches_prefixes(self) -> bool:
        """Whether this engine's prefix cache keeps anything (``--prefix-cache off``: the naive baseline)."""
        return cache_kind(self.config.prefix_cache).keeps_prefixes

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

    def load(self) -> tuple[int, int, int, int]:
        """(running, waiting, used pages, total pages), read from any thread without waiting for a
        step (a router polls it; a figure a step old is good enough, a stalled poll is not).  Used
        pages are those requests and pins hold: the cached pages nobody holds are free for the next
        request, and a pool full of them is the steady state, not a full replica (a gateway that read
        it as full stopped routing to every replica whose cache had filled)."""
        waiting = len(self.scheduler.waiting) + self._inbox.qsize()
        total = self.cache.num_pages
        return len(self.scheduler.running), waiting, total - self.cache.available(), total

    def stats(self) -> EngineStats:
        t = self._totals
        return engine_stats(self.cache, self.scheduler, t["requests"], t["prompt"], t["snapshot_cut"])

    def cache_stats(self) -> CacheStats:
        """The pool's pages by owner (free, tree, pinned, evictable, requests'), expired pins dropped first."""
        return self.cache.stats(expire_pins=True)

    def pins(self) -> tuple[list[PinInfo], dict[str, int], dict[object, dict[str, int]]]:
        """The live pins (owner, tokens, TTL left), the pins lapsed so far by cause, and by tenant."""
        return self.cache.pin_report()

    def is_pinned(self, owner: object) -> bool:
        return self.cache.is_pinned(owner)

    def pin_prefix(
        self, owner: object, ids: list[int], scope: CacheScope, ttl: float | None
    ) -> tuple[int, bool]:
        """Pin the cached part of ``ids`` (in ``scope``) for ``ttl`` seconds under ``owner``, within the pin
        budget; returns (tokens the pin covers, whether it was taken)."""
        return self.cache.pin_prefix(owner, ids, scope, ttl)

    def unpin(self, owner: object) -> None:
        """Drop ``owner``'s pin, if it has one (the pages stay cached, evictable again)."""
        self.cache.unpin(owner)

    def prompt_logprobs(self, ids: list[int], top: int, chunk_size: int | None = None) -> list[Entry]:
        """Logprobs of a prompt's own tokens (only between steps): see ``kvreuse.runtime.engine.scoring``.  A small
        ``chunk_size`` scores through the kernels decode uses (the quantized head's take <= 8 rows)."""
        return prompt_logprobs(self.runner, self.cache, chunk_size or self.config.chunk_size, ids, top)

    # -- instrumentation for benchmarks: read-only views, and one knob ------------------------------
    @property
    def model(self) -> torch.nn.Module:
        """The loaded ``CausalLM``: for parameter counts, or wrapping its forward to time it; never drive it."""
        return self.runner.model

    @property
    def model_config(self):
        """The architecture (``kvreuse.runtime.models.config.ModelConfig``) of the loaded model."""
        return self.runner.cfg

    @property
    def attention_backend(self) -> str:
        return self.runner.backend.name

    def set_chunk_size(self, tokens: int) -> None:
        """Prefill token budget per step from the next step on (benchmarks sweep it in one engine)."""
        ring_chunk = self.runner.state_pool.chunk_limit(tokens)  # window rings hold W + their chunk
        if tokens > ring_chunk:
            raise ValueError(f"chunk size {tokens} exceeds the window rings' {ring_chunk} (set it at start)")
        self.scheduler.chunk_size = tokens

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
        tensor-parallel ranks; idempotent.  A closed engine refuses new requests and steps."""
        self._closed = True
        self.cache.close()
        self.runner.close()

    def store_error(self) -> str | None:
        """Why a lower tier runs degraded (the disk tier read-only, the shared store unreachable: the
        pool serves alone), or None; thread-safe, so ``/health`` reads it without waiting for the
        engine thread."""
        return self.cache.tier_error()

    def tier_stats(self):
        """Lower-tier counters (``kvreuse.runtime.cache.store.tiers.TierStats``), or None without tiers."""
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
    verified = None if samples.verified is None else [samples.verified[r] for r in keep]
    kept = SampleResult(
        [samples.tokens[r] for r in keep], [samples.logprobs[r] for r in keep], None, verified
    )
    return batch._replace(chunks=chunks), kept, failed
