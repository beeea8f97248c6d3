"""Verify drafts against the target model's logits of one forward (rows: the last accepted token and
every drafted one).

For each position the target token is drawn exactly as the model would draw it without a draft:
greedy rows take the argmax; sampled rows draw from ``p`` with the request's randomness at that
output position (``runtime/sampling/draws.py``), and the draft ``d`` is kept when the draw equals it.
That is the rejection rule of speculative sampling (Leviathan et al. 2023, Chen et al. 2023) for a
point-mass draft ``q = 1[d]``: ``d`` is kept with probability ``min(1, p(d) / q(d)) = p(d)``, and
otherwise the token is distributed as the residual ``max(0, p - q)`` normalised (``p`` without
``d``); and since the draw never depends on the draft, a seeded request gives the same text with
speculation on or off.  The caller (``Scheduler.commit``) keeps the
drafted tokens up to the first position whose target differs from the draft, plus that target.
"""

from __future__ import annotations

import torch

from kvreuse.runtime.sampling.constrained.matcher import Matcher
from kvreuse.runtime.sampling.draws import Draws
from kvreuse.runtime.sampling.masking import apply_constraints
from kvreuse.runtime.sampling.params import SamplingParams
from kvreuse.runtime.sampling.sampler import SampleResult, row_logprobs, sample_row


def verify(
    logits: torch.Tensor,
    params: list[SamplingParams],
    draws: list[Draws | None],
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
    for i, (p, rng, draft) in enumerate(zip(params, draws, drafts)):
        if not p.greedy:
            try:
                for j in range(len(draft) + 1):
                    targets[r + j] = sample_row(logits[r + j], p, rng, j)
                    if j < len(draft) and targets[r + j] != draft[j]:
                        break  # the rows after the first miss are never kept: no draw for them
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
