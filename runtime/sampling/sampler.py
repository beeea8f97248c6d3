"""Turn logits into tokens, each row with its own request's settings.

Everything here runs in fp32 whatever the model's dtype, and a temperature below
``MIN_TEMPERATURE`` is greedy (see ``SamplingParams.greedy``), so ``logits / temperature``
cannot overflow for any temperature a request may send.

What is batch-invariant: sampled rows draw from their request's own ``torch.Generator``, so a
seeded request's draws do not depend on its neighbours, and the argmax / softmax of a row only
reads that row.  What is not: the logits themselves.  The model's matmuls pick kernels and
reduction orders by batch shape, so a row's logits differ in the last bits with what it is
batched with and with how much of its prompt came from the cache (chunk boundaries).  In fp32
that does not change the argmax in practice; in bf16 a near-tie (top-2 logit gap below ~0.25)
can flip, so greedy bf16 output may depend on batch composition.  Run fp32 (``--dtype float32``,
the CPU default) when greedy output must be reproducible across batches.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kvreuse.runtime.sampling.constrained.matcher import Matcher
from kvreuse.runtime.sampling.draws import Draws
from kvreuse.runtime.sampling.masking import apply_constraints
from kvreuse.runtime.sampling.params import SamplingParams


class SampleResult(NamedTuple):
    """Chosen token per row, optional logprob info per row, and the rows whose sampling failed
    (their request fails; the other rows' draws stand, so seeded requests keep their tokens)."""

    tokens: list[int]
    logprobs: list[tuple[float, list[tuple[int, float]]] | None]
    errors: dict[int, Exception] | None = None
    # speculative rows: per sampled sequence, (token, logprobs) at each drafted position after the first
    # (``runtime/speculative/verify.py``); None when no row drafted
    verified: list[list[tuple[int, tuple[float, list[tuple[int, float]]] | None]]] | None = None


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    draws: list[Draws | None],
    matchers: list[Matcher | None] | None = None,
) -> SampleResult:
    # fp32 (never inf/NaN for any accepted parameter); the same tensor when no row has bias or grammar
    logits = apply_constraints(logits.float(), params, matchers)
    tokens = logits.argmax(dim=-1).tolist()
    errors: dict[int, Exception] = {}
    for i, p in enumerate(params):
        if not p.greedy:
            try:
                tokens[i] = sample_row(logits[i], p, draws[i])
            except (RuntimeError, ValueError) as e:  # one row's failure is that request's, not the batch's
                errors[i] = e
    return SampleResult(tokens, row_logprobs(logits, params, tokens), errors or None)


def row_logprobs(logits: torch.Tensor, params: list[SamplingParams], tokens: list[int]) -> list:
    """Per row, for the rows that ask: (logprob of its token, top alternatives); None elsewhere."""
    lps: list = [None] * len(params)
    if any(p.logprobs is not None for p in params):
        logp = torch.log_softmax(logits, dim=-1)
        for i, p in enumerate(params):
            if p.logprobs is not None:
                top = torch.topk(logp[i], p.logprobs) if p.logprobs > 0 else None
                alts = list(zip(top.indices.tolist(), top.values.tolist())) if top is not None else []
                lps[i] = (float(logp[i, tokens[i]]), alts)
    return lps


def sample_row(row: torch.Tensor, p: SamplingParams, draws: Draws | None, offset: int = 0) -> int:
    """The token drawn at ``draws``' position + ``offset``: the same whether the row is drafted or not."""
    gen = draws.generator(offset) if draws is not None else None
    return int(torch.multinomial(probabilities(row, p).cpu(), 1, generator=gen).item())


def probabilities(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution a non-greedy row samples from: temperature, then top-k, then top-p."""
    row = row / p.temperature  # finite: fp32 logits over a temperature >= MIN_TEMPERATURE
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
    return probs
