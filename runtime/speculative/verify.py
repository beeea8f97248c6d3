"""Verify drafts against the target model's logits of one forward (rows: the last accepted token and
every drafted one).

For each position the target token is drawn as the model would draw it without a draft:
greedy rows take the argmax; sampled rows follow the rejection rule of speculative sampling
(Leviathan et al. 2023, Chen et al. 2023) with a point-mass draft ``q = 1[d]``: accept the draft ``d``
with probability ``min(1, p(d) / q(d)) = p(d)``, else draw from the residual ``max(0, p - q)``
normalised (``p`` without ``d``).  Either way the target token is distributed as ``p``, so the
output distribution is the one without speculation.  The caller (``Scheduler.commit``) keeps the
drafted tokens up to the first position whose target differs from the draft, plus that target.
"""

from __future__ import annotations

import torch

from kvreuse.runtime.sampling.constrained.matcher import Matcher
from kvreuse.runtime.sampling.masking import apply_constraints
from kvreuse.runtime.sampling.params import SamplingParams
from kvreuse.runtime.sampling.sampler import SampleResult, probabilities, row_logprobs


def verify(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    matchers: list[Matcher | None] | None,
    drafts: list[list[int]],
) -> SampleResult:
    """``logits``: ``1 + len(drafts[i])`` rows per sampled sequence ``i``, in order.  Returns the target
    at each sequence's first row in ``tokens`` / ``logprobs`` and those at its drafted rows in
    ``verified``; a row that fails fails its sequence (``errors``, keyed by sequence)."""
    counts = [1 + len(d) for d in drafts]
    row_params = [p for p, c in zip(params, counts) for _ in range(c)]
    row_matchers = None
    if matchers is not None:
        assert all(m is None or c == 1 for m, c in zip(matchers, counts)), "a grammar row drafted"
        row_matchers = [m for m, c in zip(matchers, counts) for _ in range(c)]
    logits = apply_constraints(logits.float(), row_params, row_matchers)
    targets = logits.argmax(dim=-1).tolist()
    errors: dict[int, Exception] = {}
    r = 0
    for i, (p, gen, draft) in enumerate(zip(params, generators, drafts)):
        if not p.greedy:
            try:
                for j in range(len(draft) + 1):
                    targets[r + j] = _target(logits[r + j], p, gen, draft[j] if j < len(draft) else None)
            except (RuntimeError, ValueError) as e:  # this sequence's failure, not the batch's
                errors[i] = e
        r += counts[i]
    lps = row_logprobs(logits, row_params, targets)
    tokens, first_lps, verified = [], [], []
    r = 0
    for c in counts:
        tokens.append(targets[r])
        first_lps.append(lps[r])
        verified.append([(targets[r + j], lps[r + j]) for j in range(1, c)])
        r += c
    return SampleResult(tokens, first_lps, errors or None, verified)


def _target(row: torch.Tensor, p: SamplingParams, gen: torch.Generator | None, draft: int | None) -> int:
    probs = probabilities(row, p).cpu()
    if draft is not None:
        if torch.rand((), generator=gen).item() < probs[draft].item():
            return draft
        probs[draft] = 0.0  # the residual max(0, p - q) of a point-mass draft
        if not probs.sum().item() > 0:  # p was the draft's alone up to rounding: nothing else to draw
            return draft
    return int(torch.multinomial(probs, 1, generator=gen).item())
