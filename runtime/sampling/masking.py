"""Applied in the batched sampler: each row's grammar mask and logit_bias, nothing for rows without."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvreuse.runtime.sampling.constrained.matcher import Matcher
from kvreuse.runtime.sampling.params import SamplingParams

_BITS = torch.tensor([1 << i for i in range(31)] + [-(1 << 31)], dtype=torch.int32)


def apply_constraints(
    logits: torch.Tensor, params: Sequence[SamplingParams], matchers: Sequence[Matcher | None] | None
) -> torch.Tensor:
    """``logits`` with logit_bias added and disallowed tokens at -inf, for the rows that ask.

    Returns the input tensor untouched when no row has either, so unconstrained batches pay one scan.
    """
    biased = [i for i, p in enumerate(params) if p.logit_bias]
    rows = [i for i, m in enumerate(matchers or ()) if m is not None]
    if not biased and not rows:
        return logits
    logits = logits.float().clone()
    for i in biased:
        bias = params[i].logit_bias
        ids = torch.tensor(list(bias), dtype=torch.long, device=logits.device)
        logits[i, ids] += torch.tensor(list(bias.values()), dtype=logits.dtype, device=logits.device)
    if rows:
        vocab = logits.shape[-1]
        words = (vocab + 31) // 32
        bitmask = torch.empty(len(rows), words, dtype=torch.int32)
        for k, i in enumerate(rows):
            matchers[i].fill(bitmask[k])
        allowed = ((bitmask.unsqueeze(-1) & _BITS) != 0).flatten(1)[:, :vocab]
        idx = torch.tensor(rows, device=logits.device)
        logits[idx] = logits[idx].masked_fill(~allowed.to(logits.device), float("-inf"))
    return logits
