"""Logprobs of a prompt's own tokens (``echo`` with ``logprobs``): one forward over the prompt, all rows.

Runs on the engine thread between steps (``Engine.prompt_logprobs``, called through ``AsyncEngine.run_idle``),
on pages reserved for the call and freed after it, so the prefix cache and running requests are untouched.  The first token has no
logprob (nothing precedes it): its entry is None.
"""

from __future__ import annotations

import torch

from runtime.cache.manager import CacheManager
from runtime.engine.admission import EngineError
from runtime.request import Request
from runtime.runner.forward_batch import build_forward_batch
from runtime.runner.model_runner import ModelRunner
from runtime.sampling.params import SamplingParams

Entry = tuple[int, tuple[float, list[tuple[int, float]]] | None]


@torch.inference_mode()
def prompt_logprobs(
    runner: ModelRunner, cache: CacheManager, chunk_size: int, ids: list[int], top: int
) -> list[Entry]:
    """``[(token, (logprob, top alternatives) | None)]`` for every prompt token, in order."""
    if runner.state_pool is not None:  # a hybrid's states / a window model's rings need a slot
        raise EngineError("prompt logprobs (echo) are not supported for hybrid or sliding-window models yet")
    scratch = Request("score", list(ids), len(ids), SamplingParams(max_tokens=1), frozenset())
    if not cache.reserve(scratch, len(ids)):
        raise EngineError("not enough free KV pages to score the prompt now; retry shortly")
    entries: list[Entry] = [(ids[0], None)]
    try:
        step = chunk_size
        for start in range(0, len(ids) - 1, step):
            chunk = ids[start : start + step]
            fb = build_forward_batch([(chunk, start, scratch.pages)], [True], runner.page_size, runner.device)
            fb = fb._replace(logits_rows=torch.arange(len(chunk), device=runner.device))
            logp = torch.log_softmax(runner.forward(fb).float(), dim=-1)
            nxt = ids[start + 1 : start + len(chunk) + 1]
            rows = logp[: len(nxt)]
            chosen = rows.gather(1, torch.tensor(nxt, device=rows.device).unsqueeze(1)).squeeze(1).tolist()
            alts = torch.topk(rows, top) if top > 0 else None
            for j, tid in enumerate(nxt):
                pairs = (
                    list(zip(alts.indices[j].tolist(), alts.values[j].tolist())) if alts is not None else []
                )
                entries.append((tid, (chosen[j], pairs)))
    finally:
        cache.allocator.free(scratch.pages)
    return entries
