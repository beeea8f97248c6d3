"""Issue 12, point 1: no sampling parameter can produce inf/NaN; a request that fails in the engine
fails alone (the others finish with the tokens they get alone, no page leaks) and the loop goes on;
if the loop itself dies every waiting stream gets the error at once and later streams are refused."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from kvreuse.runtime.engine.async_engine import AsyncEngine, EngineDead, RequestFailed
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.sampling import sampler
from kvreuse.runtime.sampling.draws import Draws
from kvreuse.runtime.sampling.params import MIN_TEMPERATURE, SamplingParams
from tests.engine_drive import alone, assert_no_request_pages, greedy, random_ids, run_checked, tiny_engine

TINY_TEMPERATURES = (1e-300, 5e-324, 1e-38, 1e-20, MIN_TEMPERATURE / 2)


@pytest.fixture
def eng(tiny_models) -> Engine:
    return tiny_engine(tiny_models[("llama", False)], num_pages=64, chunk_size=32)


@pytest.mark.parametrize("temperature", TINY_TEMPERATURES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_tiny_temperature_is_greedy_and_finite(temperature, dtype):
    logits = (torch.randn(3, 512, generator=torch.Generator().manual_seed(1)) * 30).to(dtype)
    params = [SamplingParams(temperature=temperature, top_p=0.9, top_k=50, logprobs=2)] * 3
    gens = [Draws(i) for i in range(3)]
    res = sampler.sample(logits, params, gens)
    assert res.tokens == logits.float().argmax(-1).tolist()
    assert all(torch.isfinite(torch.tensor(lp[0])) for lp in res.logprobs)


def test_smallest_sampled_temperature_stays_finite():
    # just above the floor, logits of a bf16 model's magnitude: every probability is finite
    logits = torch.randn(4, 512, generator=torch.Generator().manual_seed(2)).bfloat16() * 100
    params = [SamplingParams(temperature=MIN_TEMPERATURE)] * 4
    res = sampler.sample(logits, params, [Draws(i) for i in range(4)])
    assert res.tokens == logits.float().argmax(-1).tolist()  # one-hot at this temperature


def test_engine_serves_tiny_temperatures(eng):
    gen = torch.Generator().manual_seed(0)
    prompt = random_ids(gen, 12)
    want = alone(eng, prompt, greedy(4))
    for t in TINY_TEMPERATURES:
        out = eng.generate(prompt, SamplingParams(max_tokens=4, temperature=t, ignore_eos=True))[0]
        assert out.output_token_ids == want and out.finish_reason == "length"


def _failing_row(monkeypatch, bad_seed: int) -> None:
    """A sampler fault that hits only the request seeded ``bad_seed`` (fault injection)."""
    real = sampler.sample_row

    def row(r, p, d, offset=0):
        if p.seed == bad_seed:
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        return real(r, p, d, offset)

    monkeypatch.setattr(sampler, "sample_row", row)


def test_a_request_failing_in_the_sampler_fails_alone(eng, monkeypatch):
    gen = torch.Generator().manual_seed(3)
    prompts = [random_ids(gen, n) for n in (20, 45, 9)]
    params = [SamplingParams(max_tokens=6, temperature=0.8, seed=s, ignore_eos=True) for s in (1, 2, 3)]
    want = [alone(eng, p, sp) for p, sp in zip(prompts, params)]
    eng.reset_prefix_cache()
    _failing_row(monkeypatch, bad_seed=2)
    reqs = [eng.make_request(p, sp) for p, sp in zip(prompts, params)]
    done = run_checked(eng, reqs)
    outs = [done[r.request_id] for r in reqs]
    assert outs[1].finish_reason == "error" and "probability tensor" in outs[1].error
    assert [outs[0].output_token_ids, outs[2].output_token_ids] == [want[0], want[2]]
    assert_no_request_pages(eng)
    assert eng.generate(prompts[0], params[0])[0].output_token_ids == want[0]  # and it goes on


def test_a_failed_forward_fails_its_batch_and_the_engine_goes_on(eng, monkeypatch):
    gen = torch.Generator().manual_seed(4)
    prompts = [random_ids(gen, 30), random_ids(gen, 10)]
    want = alone(eng, prompts[1], greedy(5))
    real = eng.runner.step
    calls = {"n": 0}

    def step(chunks):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated kernel failure")
        return real(chunks)

    monkeypatch.setattr(eng.runner, "step", step)
    reqs = [eng.make_request(p, greedy(5)) for p in prompts]
    done = run_checked(eng, reqs)
    assert {o.finish_reason for o in done.values()} == {"error"}
    assert all("simulated kernel failure" in o.error for o in done.values())
    assert_no_request_pages(eng)
    assert eng.generate(prompts[1], greedy(5))[0].output_token_ids == want


def test_async_stream_raises_request_failed_and_others_finish(eng, monkeypatch):
    _failing_row(monkeypatch, bad_seed=7)
    gen = torch.Generator().manual_seed(5)
    prompt = random_ids(gen, 16)

    async def main():
        ae = AsyncEngine(eng)
        try:
            bad = ae.generate(prompt, SamplingParams(max_tokens=4, temperature=1.0, seed=7))
            good = ae.generate(prompt, SamplingParams(max_tokens=4, temperature=1.0, seed=8))
            res = await asyncio.wait_for(asyncio.gather(bad, good, return_exceptions=True), 60)
            assert isinstance(res[0], RequestFailed) and "probability tensor" in str(res[0])
            assert res[1].finish_reason == "length" and ae.error is None
        finally:
            ae.shutdown()

    asyncio.run(main())


def test_engine_death_fails_every_stream_at_once_and_refuses_new_ones(eng, monkeypatch):
    gen = torch.Generator().manual_seed(6)
    died: list[BaseException] = []

    async def main():
        ae = AsyncEngine(eng, on_death=died.append)
        try:
            waiting = [asyncio.ensure_future(ae.generate(random_ids(gen, 10), greedy(400))) for _ in range(3)]
            await asyncio.sleep(0.3)  # they are running
            monkeypatch.setattr(eng.scheduler, "schedule", lambda: 1 / 0)  # the loop itself breaks
            t0 = time.perf_counter()
            res = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 10)
            assert all(isinstance(r, EngineDead) for r in res), res
            assert time.perf_counter() - t0 < 5
            assert isinstance(ae.error, ZeroDivisionError) and len(died) == 1
            with pytest.raises(EngineDead):  # a later request is refused, not left waiting forever
                await asyncio.wait_for(ae.generate(random_ids(gen, 5), greedy(2)), 5)
            with pytest.raises(EngineDead):
                ae.run_idle(lambda e: e.stats())
        finally:
            ae.shutdown()

    asyncio.run(main())
