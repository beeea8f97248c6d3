"""Logprobs of a prompt's own tokens (``echo`` with ``logprobs``): one forward over the prompt, all rows.

Runs on the engine thread between steps (``Engine.prompt_logprobs``, called through ``AsyncEngine.run_idle``),
on pages reserved for the call and freed after it, so the prefix cache and running requests are untouched.  The first token has no
logprob (nothing precedes it): its entry is None.  A window model's window layers (or a hybrid's linear
layers) run on a ring (state) slot borrowed for the call the same way: chunk after chunk from position 0,
no snapshot taken.
"""

from __future__ import annotations

import torch

from kvreuse.runtime.cache.manager import CacheManager
from kvreuse.runtime.engine.admission import EngineError
from kvreuse.runtime.request import Request
from kvreuse.runtime.runner.forward_batch import build_forward_batch
from kvreuse.runtime.runner.model_runner import ModelRunner
from kvreuse.runtime.runner.model_state import StateInput
from kvreuse.runtime.sampling.params import SamplingParams

Entry = tuple[int, tuple[float, list[tuple[int, float]]] | None]


@torch.inference_mode()
def prompt_logprobs(
    runner: ModelRunner, cache: CacheManager, chunk_size: int, ids: list[int], top: int
) -> list[Entry]:
    """``[(token, (logprob, top alternatives) | None)]`` for every prompt token, in order."""
    slots = runner.state_pool  # a model without state has always one (ignored by its forward)
    if slots.num_free == 0:
        raise EngineError("no free window/state slot to score the prompt now; retry shortly")
    scratch = Request("score", list(ids), len(ids), SamplingParams(max_tokens=1), frozenset())
    if not cache.reserve(scratch, len(ids)):
        raise EngineError("not enough free KV pages to score the prompt now; retry shortly")
    slot = slots.alloc()
    entries: list[Entry] = [(ids[0], None)]
    try:
        step = slots.chunk_limit(chunk_size)  # a window ring's widest chunk
        for start in range(0, len(ids) - 1, step):
            chunk = ids[start : start + step]
            fb = build_forward_batch([(chunk, start, scratch.pages)], [True], runner.page_size, runner.device)
            fb = fb._replace(logits_rows=torch.arange(len(chunk), device=runner.device))
            st = StateInput([slot], [start == 0], [[]], [], [None])
            logp = torch.log_softmax(runner.forward(fb, st).float(), dim=-1)
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
        cache.unreserve(scratch)
        slots.free(slot)
    return entries
