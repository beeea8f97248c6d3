"""Drive an Engine step by step in tests, checking page integrity after every step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.engine.outputs import RequestOutput
from kvreuse.runtime.request import Request
from kvreuse.runtime.sampling.params import SamplingParams


def tiny_engine(model_dir: Path, record_logits: bool = False, **options) -> Engine:
    """An fp32 CPU engine on a tiny model; ``options`` override the small defaults.

    ``record_logits``: every sampled row's logits are kept on its request (``req.logits_trace``).
    """
    opts: dict = dict(model_dir=str(model_dir), dtype="float32", device="cpu", page_size=16, num_pages=256)
    opts.update(options)
    eng = Engine(**opts)
    if record_logits:
        trace_logits(eng)
    return eng


def trace_logits(eng: Engine) -> None:
    """Test hook: wrap the runner's step and the scheduler's commit so that each request collects
    the logits of its sampled rows in ``req.logits_trace`` (the engine itself keeps none)."""
    step, commit = eng.runner.step, eng.scheduler.commit
    last: list = []

    def traced_step(batch):
        res = step(batch)
        last[:] = [res.logits]
        return res

    def traced_commit(batch, samples):
        rows = iter(last[0]) if last else iter(())
        for c in batch.chunks:
            if c.sample:
                if getattr(c.req, "logits_trace", None) is None:
                    c.req.logits_trace = []
                c.req.logits_trace.append(next(rows).cpu())
        return commit(batch, samples)

    eng.runner.step, eng.scheduler.commit = traced_step, traced_commit


def random_ids(gen: torch.Generator, n: int, vocab: int = 512) -> list[int]:
    """``n`` token ids, skipping 0-2 (pad/bos/eos of the tiny models)."""
    return torch.randint(3, vocab, (n,), generator=gen).tolist()


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def run_checked(
    eng: Engine,
    reqs: Sequence[Request],
    on_step: Callable[[Engine, list[RequestOutput]], None] | None = None,
    max_steps: int = 10_000,
) -> dict[str, RequestOutput]:
    """Submit ``reqs`` and step until all finish; integrity is checked after every step."""
    for r in reqs:
        eng.submit(r)
    done: dict[str, RequestOutput] = {}
    for _ in range(max_steps):
        if len(done) == len(reqs):
            return done
        outs = eng.step()
        eng.cache.check_integrity()
        for out in outs:
            if out.finished:
                done[out.request_id] = out
        if on_step is not None:
            on_step(eng, outs)
    raise AssertionError(
        f"{len(reqs) - len(done)} requests unfinished after {max_steps} steps: {eng.stats()}"
    )


def generate_checked(
    eng: Engine, prompts: Sequence[list[int]], params: Sequence[SamplingParams]
) -> list[Request]:
    """Run prompts together with integrity checks; returns the finished Request objects (with logits)."""
    reqs = [eng.make_request(list(p), sp) for p, sp in zip(prompts, params)]
    run_checked(eng, reqs)
    return reqs


def alone(eng: Engine, prompt: list[int], params: SamplingParams) -> list[int]:
    """Output tokens of ``prompt`` run with nothing else in the engine."""
    assert not eng.has_work()
    return eng.generate(list(prompt), params)[0].output_token_ids


def assert_no_request_pages(eng: Engine) -> None:
    """Idle engine: every page is free or in the tree, none held by a request."""
    s = eng.cache.check_integrity()
    assert s.request_pages == 0, s
    assert s.free_pages + s.tree_pages == s.total_pages, s
    st = eng.stats()
    assert st.running == 0 and st.waiting == 0, st


def assert_logits_close(a: Request, b: Request, atol: float = 1e-4) -> None:
    """Same sampled rows, each within ``atol``."""
    assert a.logits_trace is not None and b.logits_trace is not None
    assert len(a.logits_trace) == len(b.logits_trace) == len(a.output_ids)
    for i, (x, y) in enumerate(zip(a.logits_trace, b.logits_trace)):
        err = (x - y).abs().max().item()
        assert err <= atol, f"{a.request_id} row {i}: max abs logit diff {err}"
