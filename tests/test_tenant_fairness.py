"""Fair steps between tenants (issue 39): a tenant with nothing running is admitted before another
tenant's running prefill takes the step's budget, and while two tenants have work (or had within
``tenant_linger_s``) a step prefills at most ``tenant_chunk_size`` tokens, and no more than the step
clock says fit ``tenant_step_s``.  With one tenant the order and the chunks are what they always were.
Outputs stay equal to each request run alone (greedy, fp32)."""

from __future__ import annotations

import torch

from kvreuse.runtime.request import CacheScope, Status
from kvreuse.runtime.scheduler import MIN_TENANT_CHUNK, StepClock
from tests.engine_drive import greedy, random_ids, tiny_engine

CHUNK, TENANT_CHUNK = 256, 32


def _engine(model_dir):
    return tiny_engine(model_dir, num_pages=256, chunk_size=CHUNK, tenant_chunk_size=TENANT_CHUNK)


def _long_then_short(model_dir, short_ns: str, linger_s: float = 0.0):
    """A's 700-token prompt takes one step alone; then B's 9-token request arrives.  Returns the engine,
    the requests and the per-step chunk lengths of each from then on.  ``linger_s``: how long B counts
    as active after it ends (0: not at all)."""
    eng = _engine(model_dir)
    eng.scheduler.tenant_linger_s = linger_s
    g = torch.Generator().manual_seed(7)
    a = eng.make_request(random_ids(g, 700), greedy(3), scope=CacheScope("tenant-a"))
    b = eng.make_request(random_ids(g, 9), greedy(1), scope=CacheScope(short_ns))
    eng.submit(a)
    eng.step()
    assert a.num_computed == CHUNK  # alone: the whole chunk
    eng.submit(b)
    steps: list[dict[str, int]] = []
    schedule = eng.scheduler.schedule

    def recording():
        batch = schedule()
        if batch is not None:
            steps.append({("a" if c.req is a else "b"): c.length for c in batch.chunks})
        return batch

    eng.scheduler.schedule = recording
    while a.status is not Status.FINISHED or b.status is not Status.FINISHED:
        eng.step()
        eng.cache.check_integrity()
    return eng, a, b, steps


def test_another_tenants_short_request_is_not_queued_behind_a_long_prompt(tiny_models):
    model = tiny_models[("llama", False)]
    _, a, b, steps = _long_then_short(model, "tenant-b")
    # B starts in the very next step and is done there (its 9 tokens and its one sampled token)
    assert steps[0].get("b") == 9
    assert b.output_ids and b.finish_reason == "length"
    # while B has work the step is the tenant chunk; once B is done A gets whole chunks again
    assert steps[0]["a"] == TENANT_CHUNK - 9
    assert max(s.get("a", 0) for s in steps[1:]) == CHUNK
    # the outputs are those of each request alone
    for req in (a, b):
        alone = _engine(model)
        assert alone.generate([req.prompt_ids], req.params)[0].output_token_ids == req.output_ids


def test_one_tenant_keeps_arrival_order_and_whole_chunks(tiny_models):
    _, a, b, steps = _long_then_short(tiny_models[("llama", False)], "tenant-a")
    # the same tenant's short request waits for the budget A's prompt leaves, as before
    first_b = next(i for i, s in enumerate(steps) if "b" in s)
    assert all(s["a"] == CHUNK for s in steps[:first_b])
    assert a.num_prompt - CHUNK * (first_b + 1) < CHUNK  # B started only once A's prompt fit in a step
    assert b.output_ids


def test_a_tenant_that_just_got_its_answer_still_gets_short_steps(tiny_models):
    """An agent sends its next request right after an answer: the step running when it arrives must
    already be short, so the other tenant's steps stay short for ``tenant_linger_s`` after B ends."""
    _, _, b, steps = _long_then_short(tiny_models[("llama", False)], "tenant-b", linger_s=60.0)
    done = next(i for i, s in enumerate(steps) if "b" in s)
    assert b.output_ids and all(s["a"] <= TENANT_CHUNK for s in steps[done + 1 :] if "a" in s)
    assert len(steps) > done + 1  # A still had prompt left after B was done


def test_step_clock_fits_the_fixed_and_per_token_cost():
    """Steps timed as 50 ms + 2 ms a token (a busy machine): 0.25 s fits 100 tokens; one step size
    only (no slope to fit) is priced per token, fixed cost included."""
    clock = StepClock()
    assert clock.tokens_within(0.25) is None  # nothing seen yet: the token budget alone decides
    for n in (1, 10, 40, 128, 3, 64):
        clock.observe(n, 0.05 + 0.002 * n)
    assert clock.tokens_within(0.25) == 100
    assert clock.tokens_within(0.04) == 0
    flat = StepClock()
    for _ in range(4):
        flat.observe(100, 0.5)
    assert flat.tokens_within(0.25) == 50


def test_on_a_slow_machine_the_other_tenants_steps_fit_the_step_time(tiny_models):
    """Where a 32-token step takes longer than ``tenant_step_s`` (the clock says 10 ms a token), A's
    chunks beside B shrink to what fits 0.1 s (B's own 9 tokens and its decode row included); with one
    tenant they are whole chunks whatever the clock says."""
    eng = _engine(tiny_models[("llama", False)])
    eng.scheduler.tenant_step_s = 0.1
    eng.scheduler.clock.observe = lambda tokens, seconds: None  # keep the slow machine's figures
    for n in (1, 10, 50, 100):
        StepClock.observe(eng.scheduler.clock, n, 0.01 * n)
    g = torch.Generator().manual_seed(7)
    a = eng.make_request(random_ids(g, 700), greedy(3), scope=CacheScope("tenant-a"))
    eng.submit(a)
    eng.step()
    assert a.num_computed == CHUNK
    b = eng.make_request(random_ids(g, 9), greedy(4), scope=CacheScope("tenant-b"))
    eng.submit(b)
    # 10 tokens fit 0.1 s, under the floor: B's 9 tokens are admitted first, A gets what the floor leaves
    eng.step()
    assert b.num_computed == 9 and a.num_computed == CHUNK + MIN_TENANT_CHUNK - 9
    eng.step()  # B decodes (one row): A gets the floor again, not a whole tenant chunk
    assert a.num_computed == CHUNK + 2 * MIN_TENANT_CHUNK - 9


def test_forgetting_the_tenants_ends_the_linger(tiny_models):
    """``Scheduler.forget_tenants`` (a benchmark's new round): a tenant that ended lately no longer
    shortens the next step; without it the step is short for ``tenant_linger_s``."""
    eng, _, _, _ = _long_then_short(tiny_models[("llama", False)], "tenant-b", linger_s=60.0)
    eng.scheduler.schedule = type(eng.scheduler).schedule.__get__(eng.scheduler)
    g = torch.Generator().manual_seed(8)
    for forget in (False, True):
        req = eng.make_request(random_ids(g, 700), greedy(1), scope=CacheScope("tenant-a"))
        if forget:
            eng.scheduler.forget_tenants()
        eng.submit(req)
        eng.step()
        assert (req.num_computed == CHUNK) == forget  # else at most the tenant chunk
        assert req.num_computed <= TENANT_CHUNK or forget
        eng.abort(req.request_id)
        eng.step()
