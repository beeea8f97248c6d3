"""The ideal prefill: only tokens no earlier request (prompt or generated output) has computed."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvreuse.chat_templates.render import first_divergence


def best_prefix(prompt: Sequence[int], earlier: Sequence[Sequence[int]]) -> int:
    """Longest common prefix of ``prompt`` with any of the ``earlier`` token streams."""
    p = np.asarray(prompt, dtype=np.int64)
    return max((first_divergence(p, s) for s in earlier), default=0)


def computed_streams(
    prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]] | None = None
) -> list[list[int]]:
    """Each request's tokens that have KV: its prompt and every generated token but the last, which is
    sampled from the final step's logits and never run through the model."""
    outputs = outputs if outputs is not None else [[] for _ in prompts]
    return [list(p) + list(o)[:-1] for p, o in zip(prompts, outputs, strict=True)]


def ideal_prefill(
    prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]] | None = None
) -> list[int]:
    """Per request: ``len(prompt_k) - LCP(prompt_k, any earlier computed stream_j)``, at least 1.

    At least one token is always computed because the next-token logits come from the last prompt
    position, so a fully cached prompt still costs one token.
    """
    streams = as_arrays(computed_streams(prompts, outputs))
    return [max(1, len(p) - best_prefix(p, streams[:k])) for k, p in enumerate(prompts)]


def as_arrays(streams: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Token streams as int64 arrays, converted once: ``best_prefix`` compares each request with every
    earlier stream, and converting a list on every comparison cost ~90% of an agent session's accounting."""
    return [np.asarray(s, dtype=np.int64) for s in streams]
