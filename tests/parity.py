"""Parity against transformers, shared by every family's tests (dense, MoE, hybrid): the same
assertions on logits of every position and on greedy generation."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.request import Request
from kvreuse.runtime.runner.forward_batch import build_forward_batch
from kvreuse.runtime.runner.model_state import StateInput
from kvreuse.runtime.sampling.params import SamplingParams
from tests.engine_drive import random_ids


def all_logits(eng: Engine, ids: list[int]) -> torch.Tensor:
    """Logits of every position: prefill the whole sequence in one chunk and sample every row."""
    r = eng.runner
    req = Request("x", list(ids), len(ids), SamplingParams(), frozenset())
    eng.cache.admit(req)
    assert eng.cache.reserve(req, len(ids) - req.num_computed)
    fb = build_forward_batch([(ids, 0, req.pages)], [True], eng.cache.page_size, eng.device)
    fb = fb._replace(logits_rows=torch.arange(len(ids)))
    # the request's state slot (a ring, a hybrid's state from zero; none for a dense model), no snapshots
    states = StateInput([eng.cache.states.slot(req)], [True], [[]], [], [None])
    logits = r.state_pool.run(r.model, fb, r.kv_layers, r.backend, states)
    eng.cache.release(req, cache=False)
    return logits


def assert_logits_match(
    eng: Engine,
    hf,
    lengths: Sequence[int],
    seed: int = 1,
    atol: float = 1e-4,
    label: str = "",
    min_scale: float = 0.0,
) -> None:
    """Every position's logits within ``atol`` of transformers' at each length (random ids 3..511);
    ``min_scale``: the reference logits must reach it (so ``atol`` is small relative to them)."""
    g = torch.Generator().manual_seed(seed)
    for n in lengths:
        ids = torch.randint(3, 512, (n,), generator=g).tolist()
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        assert ref.abs().max() > min_scale
        err = (all_logits(eng, ids) - ref).abs().max().item()
        assert err < atol, f"{label} len={n}: max abs err {err}"
    eng.cache.check_integrity()


def hf_greedy_mismatch(hf, prompt: Sequence[int], output: Sequence[int]) -> int | None:
    """The first step at which ``output`` is not transformers' greedy continuation of ``prompt``, or None.

    Greedy decoding is the argmax of the next-token logits given everything before, so one forward of
    transformers over prompt + output checks every step of it at once: the same tokens as ``generate``
    would give, without its step-by-step loop (many times slower for the hybrid models' reference).
    """
    ids = list(prompt) + list(output)
    with torch.no_grad():
        steps = hf(torch.tensor([ids[:-1]])).logits[0, len(prompt) - 1 :].argmax(-1).tolist()
    return next((i for i, (a, b) in enumerate(zip(steps, output)) if a != b), None)


def assert_greedy_matches_generate(eng: Engine, hf, prompts: Sequence[list[int]], max_new: int = 64) -> None:
    """Batched greedy decode (over the engine's chunked prefill), token-identical to transformers' greedy."""
    outs = eng.generate([list(p) for p in prompts], SamplingParams(max_tokens=max_new, ignore_eos=True))
    for ids, out in zip(prompts, outs):
        assert len(out.output_token_ids) == max_new
        step = hf_greedy_mismatch(hf, ids, out.output_token_ids)
        assert step is None, f"prompt of {len(ids)}: differs from transformers' greedy at step {step}"
    eng.cache.check_integrity()


def assert_session_cached_equals_uncached(on: Engine, off: Engine, turns: int, seed: int = 5) -> None:
    """A multi-turn session (each prompt = the previous prompt + its output + new tokens) gives the same
    greedy output with the prefix cache (``on``) as without (``off``), and the cache hits."""
    gen = torch.Generator().manual_seed(seed)
    prev: list[int] = []
    cached = 0
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    for turn in range(turns):
        prompt = prev + random_ids(gen, 3 + 5 * turn)
        a, b = on.make_request(prompt, params), off.make_request(prompt, params)
        for eng, req in ((on, a), (off, b)):
            eng.submit(req)
            while eng.has_work():
                eng.step()
                eng.cache.check_integrity()
        assert a.output_ids == b.output_ids, f"turn {turn}"
        cached += a.cached_tokens
        prev = list(a.tokens)
    assert cached > 0


def first_logits(eng: Engine, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    """12 greedy tokens of ``prompt`` alone, and the logits of the first (``record_logits`` engines)."""
    req = eng.make_request(prompt, SamplingParams(max_tokens=12, ignore_eos=True))
    eng.submit(req)
    while eng.has_work():
        eng.step()
    return req.output_ids, req.logits_trace[0]


def assert_prompt_logprobs_match(
    eng: Engine, hf, ids: list[int], chunk_size: int, atol: float = 1e-4
) -> None:
    """Echoed prompt logprobs (``Engine.prompt_logprobs``, chunk by chunk) within ``atol`` of transformers'
    log-softmax over the whole prompt, each token's and its top-3 alternatives (ids and values)."""
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
    entries = eng.prompt_logprobs(ids, top=3, chunk_size=chunk_size)
    assert [t for t, _ in entries] == ids and entries[0][1] is None
    for pos, (tid, scored) in enumerate(entries[1:], start=1):
        assert scored is not None
        logp, alts = scored
        assert abs(logp - ref[pos - 1, tid].item()) < atol, f"position {pos}"
        top = torch.topk(ref[pos - 1], 3)
        assert [a for a, _ in alts] == top.indices.tolist(), f"position {pos}"
        assert max(abs(v - r) for (_, v), r in zip(alts, top.values.tolist())) < atol
    eng.cache.check_integrity()
