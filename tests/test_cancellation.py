"""Cancelling a request returns every page it held, whether it was waiting, prefilling or decoding,
and whether it was aborted on the engine or its async stream's consumer went away."""

from __future__ import annotations

import asyncio

import pytest
import torch

from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine, EngineError
from kvreuse.runtime.request import Status
from tests.engine_drive import alone, assert_no_request_pages, greedy, random_ids, tiny_engine

PS = 16


def _step_until(eng: Engine, cond, limit: int = 500) -> None:
    for _ in range(limit):
        if cond():
            return
        eng.step()
        eng.cache.check_integrity()
    raise AssertionError("condition never reached")


def _abort_and_check(eng: Engine, req) -> None:
    assert eng.stats().request_pages > 0  # it really holds pages of its own before the abort
    computed = req.num_computed
    eng.abort(req.request_id)
    outs = eng.step()
    eng.cache.check_integrity()
    (out,) = [o for o in outs if o.request_id == req.request_id]
    assert out.finished and out.finish_reason == "abort"
    assert req.status is Status.FINISHED and req.pages == []
    assert req not in eng.scheduler.running and req not in eng.cache.live
    # its computed whole pages stay reusable in the tree; nothing else is kept
    assert eng.stats().tree_pages >= computed // PS


@pytest.fixture
def eng(tiny_models) -> Engine:
    return tiny_engine(tiny_models[("llama", False)], page_size=PS, num_pages=64, chunk_size=32)


def test_abort_mid_prefill_frees_pages(eng):
    gen = torch.Generator().manual_seed(0)
    other_prompt = random_ids(gen, 20)
    other = eng.make_request(other_prompt, greedy(12))
    victim = eng.make_request(random_ids(gen, 200), greedy(8))
    eng.submit(other)
    eng.submit(victim)
    _step_until(eng, lambda: victim.num_computed >= 64)
    assert victim.num_computed < victim.num_prompt and not victim.output_ids
    _abort_and_check(eng, victim)
    _step_until(eng, lambda: other.finish_reason is not None)
    assert_no_request_pages(eng)
    eng.reset_prefix_cache()
    assert alone(eng, other_prompt, greedy(12)) == other.output_ids  # the abort did not disturb it


def test_abort_mid_decode_frees_pages(eng):
    gen = torch.Generator().manual_seed(1)
    victim = eng.make_request(random_ids(gen, 40), greedy(30))
    eng.submit(victim)
    _step_until(eng, lambda: len(victim.output_ids) >= 3)
    _abort_and_check(eng, victim)
    assert len(victim.output_ids) < 30
    assert_no_request_pages(eng)


def test_abort_waiting_and_unknown_requests(tiny_models):
    eng = tiny_engine(tiny_models[("llama", False)], page_size=PS, num_pages=64, max_running=1)
    gen = torch.Generator().manual_seed(2)
    first = eng.make_request(random_ids(gen, 30), greedy(4))
    queued = eng.make_request(random_ids(gen, 30), greedy(4))
    eng.submit(first)
    eng.submit(queued)
    eng.step()
    assert queued.status is Status.WAITING and first.status is Status.RUNNING
    eng.abort(queued.request_id)
    eng.abort("no-such-request")  # ignored
    outs = eng.step()
    assert any(o.request_id == queued.request_id and o.finish_reason == "abort" for o in outs)
    assert not queued.output_ids
    _step_until(eng, lambda: not eng.has_work())
    assert first.finish_reason == "length"
    assert_no_request_pages(eng)


async def _idle_stats(ae: AsyncEngine, timeout: float = 20.0):
    """Stats read on the engine thread once nothing runs or waits."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        s = await asyncio.to_thread(ae.run_idle, lambda e: e.stats())
        if (s.running == 0 and s.waiting == 0) or loop.time() > deadline:
            return s
        await asyncio.sleep(0.02)


def test_async_consumer_that_stops_early_aborts_the_request(tiny_models):
    eng = tiny_engine(tiny_models[("llama", False)], page_size=PS, num_pages=64)
    max_tokens = 600  # far more than the stream is read for: a finished request would not prove the abort

    async def main():
        ae = AsyncEngine(eng)
        try:
            seen = 0
            async for out in ae.stream(eng.make_request(list(range(10, 30)), greedy(max_tokens))):
                seen += 1
                assert not out.finished
                if seen == 2:
                    break  # the generator is closed by the loop's async-generator finaliser
            s = await _idle_stats(ae)
            assert (s.running, s.waiting, s.request_pages) == (0, 0, 0), s
            assert s.generated_tokens < max_tokens
            assert ae.num_pending == 0

            task = asyncio.create_task(ae.generate(list(range(40, 70)), greedy(max_tokens)))
            await asyncio.sleep(0.3)
            task.cancel()  # the caller goes away mid-request
            with pytest.raises(asyncio.CancelledError):
                await task
            s = await _idle_stats(ae)
            assert (s.running, s.waiting, s.request_pages) == (0, 0, 0), s
            assert s.generated_tokens < 2 * max_tokens

            done = await ae.generate(list(range(10, 30)), greedy(5))  # still serving afterwards
            assert done.finished and len(done.output_token_ids) == 5
            return await asyncio.to_thread(ae.run_idle, lambda e: e.cache.check_integrity())
        finally:
            ae.shutdown()

    s = asyncio.run(main())
    assert s.request_pages == 0 and s.free_pages + s.tree_pages == s.total_pages
    assert eng.stats().requests == 3


def test_request_larger_than_kv_pool_or_context_is_rejected(tiny_models):
    eng = tiny_engine(tiny_models[("llama", False)], page_size=PS, num_pages=8)  # 128 tokens of KV
    with pytest.raises(EngineError) as err:
        eng.make_request(list(range(3, 103)), greedy(50))
    msg = str(err.value)
    assert "150" in msg and "128" in msg and "100" in msg
    big = tiny_engine(tiny_models[("llama", False)], page_size=PS, num_pages=128)  # 2048 tokens > context
    with pytest.raises(EngineError) as err:
        big.make_request([5] * 1000, greedy(100))
    msg = str(err.value)
    assert "1100" in msg and "1024" in msg
    assert not eng.has_work() and not big.has_work()


def test_shutdown_ends_pending_streams(tiny_models):
    eng = tiny_engine(tiny_models[("llama", False)], page_size=PS, num_pages=64)

    async def main():
        ae = AsyncEngine(eng)
        task = asyncio.create_task(ae.generate(list(range(10, 30)), greedy(600)))
        while eng.stats().generated_tokens == 0:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(ae.shutdown)
        with pytest.raises(RuntimeError, match="shut down"):
            await asyncio.wait_for(task, 10)  # a caller still waiting must not hang forever
        with pytest.raises(RuntimeError, match="shut down"):
            await asyncio.wait_for(ae.generate([5, 6, 7], greedy(2)), 10)

    asyncio.run(main())
