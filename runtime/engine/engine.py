"""The offline engine: tokens in, tokens out, KV reused across requests.

``Engine.step`` is the whole loop body: drain the inbox (adds, aborts and calls from any
thread), let the scheduler pick a batch, run it (forward + sample), let the scheduler commit
the result (progress, cached pages, finished requests), detokenise, and return outputs.
``AsyncEngine`` runs it in a background thread; ``generate`` runs it inline.  Callers use the
methods here (requests in, steps, outputs, stats: ``tests/test_engine_surface.py`` holds the list),
what each component owns through it (the cache's pins, tiers and integrity through the cache manager's
public methods, ``Engine.cache``; a request's checks and capacities through ``Engine.admission``), and
never the cache manager's parts (``tests/test_cache_wall.py``).  Benchmarks and tests read the runner
and the scheduler (``Engine.runner``, ``Engine.scheduler``) as instrumentation; servers do not.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from pathlib import Path

import torch

from kvreuse.runtime.cache.manager import CacheManager
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
        self.model_config = mc  # the architecture (``kvreuse.runtime.models.config.ModelConfig``)
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
        grammars = GrammarCompiler(self.tokenizer, mc.vocab_size, self.eos_ids, cfg.grammar_compile_timeout)
        self.admission = Admission(  # the grammars compile lazily
            self.tokenizer, mc.vocab_size, self.max_model_len, self.runner.pool.num_tokens,
            self.eos_ids, grammars, cfg.seed,
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

    # -- the loop ---------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.scheduler.has_work() or not self._inbox.empty()

    def step(self) -> list[RequestOutput]:
        """inbox -> schedule -> forward + sample -> commit -> detokenise -> outputs."""
        if self._closed:  # its store is released and its ranks are gone: nothing may run on them
            raise EngineError("the engine is closed")
        outputs = self._drain_inbox()
        batch = self.scheduler.schedule()  # the cache's persist clock ticks first
        return outputs if batch is None else outputs + self._run(batch)

    def _run(self, batch: Batch) -> list[RequestOutput]:
        """Forward + sample ``batch``, commit it, and detokenise; a failed row or forward ends only the
        requests it is about."""
        outputs: list[RequestOutput] = []
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
        return self._finish(req, "error", error=f"{type(e).__name__}: {e}".splitlines()[0][:300])

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
                return self._finish(req, reason, delta, new_tokens=i + 1)
        return make_output(req, detok, delta, len(toks))

    def _finish(
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

    def prompt_logprobs(self, ids: list[int], top: int, chunk_size: int | None = None) -> list[Entry]:
        """Logprobs of a prompt's own tokens (only between steps): see ``kvreuse.runtime.engine.scoring``.  A small
        ``chunk_size`` scores through the kernels decode uses (the quantized head's take <= 8 rows)."""
        return prompt_logprobs(self.runner, self.cache, chunk_size or self.config.chunk_size, ids, top)

    def close(self) -> None:
        """Persist the cache to the disk tier, release the store (its lock) and stop the other
        tensor-parallel ranks; idempotent.  A closed engine refuses new requests and steps."""
        self._closed = True
        self.cache.close()
        self.runner.close()

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
