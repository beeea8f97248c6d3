"""Continuous batching: results do not depend on the batch, and a pool that runs out only slows things down."""

from __future__ import annotations

import random

import torch

from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.sampling.params import SamplingParams
from tests.engine_drive import alone, assert_no_request_pages, greedy, random_ids, run_checked, tiny_engine


def _mixed_params(i: int) -> SamplingParams:
    """Greedy for even i; seeded sampling with a different temperature / top-p / top-k mix otherwise."""
    if i % 2 == 0:
        return greedy(6 + i % 5)
    kinds = [
        dict(temperature=0.8),
        dict(temperature=1.2, top_p=0.9),
        dict(temperature=1.0, top_k=20),
        dict(temperature=0.7, top_p=0.8, top_k=50),
    ]
    return SamplingParams(max_tokens=6 + i % 5, seed=1000 + i, ignore_eos=True, **kinds[(i // 2) % 4])


def _run_batch(
    eng: Engine, prompts: list[list[int]], params: list[SamplingParams], order: list[int]
) -> list[list[int]]:
    reqs = {i: eng.make_request(prompts[i], params[i]) for i in order}
    run_checked(eng, [reqs[i] for i in order])
    assert_no_request_pages(eng)
    return [reqs[i].output_ids for i in range(len(prompts))]


def test_sixteen_concurrent_requests_equal_running_alone(tiny_models):
    d = tiny_models[("llama", False)]
    gen = torch.Generator().manual_seed(0)
    prompts = [random_ids(gen, 3 + 9 * i) for i in range(16)]  # 3 .. 138 tokens
    params = [_mixed_params(i) for i in range(16)]
    eng = tiny_engine(d, num_pages=128, chunk_size=128)
    batched = _run_batch(eng, prompts, params, list(range(16)))
    assert all(len(o) == p.max_tokens for o, p in zip(batched, params))
    # run to run: a fresh engine, requests submitted in another order (so batched differently)
    order = list(range(16))
    random.Random(1).shuffle(order)
    again = _run_batch(tiny_engine(d, num_pages=128, chunk_size=64), prompts, params, order)
    assert again == batched
    solo = tiny_engine(d, prefix_cache="off", num_pages=64)
    for i, (p, sp) in enumerate(zip(prompts, params)):
        assert alone(solo, p, sp) == batched[i], f"request {i} ({'greedy' if sp.greedy else 'sampled'})"
    sampled = [batched[i] for i in range(1, 16, 2)]
    assert len({tuple(o) for o in sampled}) == len(sampled)  # the seeds really differ


def test_fifty_requests_under_pool_pressure(tiny_models):
    d = tiny_models[("llama", False)]
    gen = torch.Generator().manual_seed(1)
    prompts = [random_ids(gen, 10 + (7 * i) % 50) for i in range(50)]
    params = [greedy(4 + i % 9) for i in range(50)]
    ps, pages = 4, 40  # 160 tokens of KV; the 50 requests need ~2,400
    eng = tiny_engine(d, page_size=ps, num_pages=pages, chunk_size=96, max_running=16)
    total_kv = sum(-(-(len(p) + sp.max_tokens) // ps) for p, sp in zip(prompts, params))
    assert total_kv > 10 * pages
    reqs = [eng.make_request(p, sp) for p, sp in zip(prompts, params)]
    peak = {"running": 0}

    def watch(e: Engine, _outs) -> None:
        peak["running"] = max(peak["running"], len(e.scheduler.running))
        for r in e.scheduler.running:  # a running request's pages are its own or locked in the tree
            assert not any(e.cache.allocator.is_free(p) for p in r.pages)

    run_checked(eng, reqs, on_step=watch)
    s = eng.stats()
    assert s.retractions > 0, "the setup is meant to run the pool dry during decode"
    assert s.generated_tokens == sum(sp.max_tokens for sp in params)  # a retraction never resamples a token
    assert_no_request_pages(eng)
    solo = tiny_engine(d, prefix_cache="off", num_pages=64)
    for r, p, sp in zip(reqs, prompts, params):
        assert r.finish_reason == "length"
        assert r.output_ids == alone(solo, p, sp), r.request_id
    retracted = sum(r.retractions > 0 for r in reqs)
    print(f"\npressure: retractions={s.retractions} retracted_requests={retracted} peak_running={peak['running']} "
          f"evicted_pages={s.evicted_pages} total_kv_pages={total_kv} pool_pages={pages}")  # fmt: skip


class _ChunkLog:
    """Wraps ``Scheduler.schedule`` to record each step's chunks and check what is sampled."""

    def __init__(self, eng: Engine) -> None:
        self.inner = eng.scheduler.schedule
        self.steps: list[list[tuple]] = []
        eng.scheduler.schedule = self

    def __call__(self):
        batch = self.inner()
        if batch is None:
            return None
        chunks = batch.chunks
        for c in chunks:
            ends = c.start + c.length == len(c.req.tokens)
            assert c.sample == ends, (
                f"{c.req.request_id}: sample={c.sample} for tokens {c.start}:{c.start + c.length}"
            )
        assert sum(batch.step.sample_mask) == len(batch.step.params)  # one sampling row per sampled chunk
        self.steps.append([(c.req.request_id, c.start, c.length, c.req.num_prompt) for c in chunks])
        return batch


def _streams_and_long_prompt(eng: Engine, long_len: int):
    """Four decoding streams, then two long prompts arrive; returns the requests and per-step progress."""
    gen = torch.Generator().manual_seed(2)
    streams = [eng.make_request(random_ids(gen, 12 + 5 * i), greedy(40)) for i in range(4)]
    longs = [eng.make_request(random_ids(gen, n), greedy(3)) for n in (long_len, long_len + 11)]
    for r in streams:
        eng.submit(r)
    while any(not r.output_ids for r in streams):
        eng.step()
    for r in longs:
        eng.submit(r)
    progress = []  # per step: stream output lengths before/after, long requests' state after
    while any(r.finish_reason is None for r in streams + longs):
        before = [len(r.output_ids) for r in streams]
        eng.step()
        eng.cache.check_integrity()
        after = [len(r.output_ids) for r in streams]
        progress.append(
            (
                before,
                after,
                [(r.num_computed, r.num_prompt, len(r.output_ids)) for r in longs if r.finish_reason is None],
            )
        )
    assert_no_request_pages(eng)
    return streams, longs, progress


def test_chunked_prefill_keeps_decodes_flowing(tiny_models):
    d = tiny_models[("llama", False)]
    chunk, long_len = 32, 9 * 32 + 1  # a 1-token tail after whole chunks must count against the budget too
    eng = tiny_engine(d, chunk_size=chunk, num_pages=128, record_logits=True)
    log = _ChunkLog(eng)
    streams, longs, progress = _streams_and_long_prompt(eng, long_len)
    first = len(log.steps) - len(progress)
    prefill_steps = 0
    for step, (before, after, long_state) in zip(log.steps[first:], progress):
        prompt_tokens = sum(
            min(start + n, n_prompt) - start for _, start, n, n_prompt in step if start < n_prompt
        )
        assert prompt_tokens <= chunk, step
        prefilling = any(computed < n_prompt for computed, n_prompt, _ in long_state) or prompt_tokens > 0
        prefill_steps += prefilling
        for b, a, r in zip(before, after, streams):
            if b < r.params.max_tokens:
                assert a == b + 1, "a running decode skipped a step while a prompt was prefilled"
        for computed, n_prompt, n_out in long_state:
            assert n_out == 0 or computed >= n_prompt, "a partly prefilled request was sampled"
    assert prefill_steps >= (2 * long_len + 11) // chunk  # the long prompts really were split
    ref = tiny_engine(d, chunk_size=4096, num_pages=128, record_logits=True)
    ref_streams, ref_longs, _ = _streams_and_long_prompt(ref, long_len)
    for a, b in zip(streams + longs, ref_streams + ref_longs):
        assert a.output_ids == b.output_ids
        assert len(a.logits_trace) == len(b.logits_trace)
        for x, y in zip(a.logits_trace, b.logits_trace):
            assert (x - y).abs().max().item() <= 1e-4
