"""Turn logits into tokens, each row with its own request's settings.

Greedy rows are an argmax, so they do not depend on what else is in the batch; sampled
rows draw from their request's own ``torch.Generator`` so a seeded request gives the same
tokens whatever it is batched with.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from runtime.constrained.masking import apply_constraints
from runtime.constrained.matcher import Matcher
from runtime.sampling import SamplingParams


class SampleResult(NamedTuple):
    """Chosen token per row, and optional logprob info per row."""

    tokens: list[int]
    logprobs: list[tuple[float, list[tuple[int, float]]] | None]


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    matchers: list[Matcher | None] | None = None,
) -> SampleResult:
    logits = apply_constraints(logits, params, matchers)  # the same tensor when no row has bias or grammar
    tokens = logits.argmax(dim=-1).tolist()
    for i, p in enumerate(params):
        if not p.greedy:
            tokens[i] = _sample_row(logits[i], p, generators[i])
    lps: list = [None] * len(params)
    if any(p.logprobs is not None for p in params):
        logp = torch.log_softmax(logits.float(), dim=-1)
        for i, p in enumerate(params):
            if p.logprobs is not None:
                top = torch.topk(logp[i], p.logprobs) if p.logprobs > 0 else None
                alts = list(zip(top.indices.tolist(), top.values.tolist())) if top is not None else []
                lps[i] = (float(logp[i, tokens[i]]), alts)
    return SampleResult(tokens, lps)


def _sample_row(row: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    row = row.float() / p.temperature
    if p.top_k > 0:
        kth = torch.topk(row, min(p.top_k, row.numel())).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    probs = torch.softmax(row, dim=-1)
    if p.top_p < 1.0:
        sorted_p, idx = probs.sort(descending=True)
        cum = sorted_p.cumsum(0)
        drop = cum - sorted_p > p.top_p  # keep the smallest set whose mass reaches top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, idx, sorted_p)
    return int(torch.multinomial(probs.cpu(), 1, generator=gen).item())
