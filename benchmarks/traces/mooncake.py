"""Mooncake-format request traces (kvcache-ai/Mooncake, FAST'25): read, slice and materialise into tokens.

One JSON object a line: ``timestamp`` (ms since the trace start), ``input_length``,
``output_length`` and ``hash_ids``, one id per 512-token block of the input (equal ids: equal
block content, so two requests share exactly the leading blocks whose ids agree).  The trace
files stay out of the repository: the default is ``../shared/traces/`` beside the checkout, or
``--trace PATH``.

Materialising gives every block id its own deterministic tokens, so the radix tree sees the
trace's own sharing.  ``unit`` scales the token axis down: one replayed token stands for ``unit``
trace tokens (a 512-token block becomes ``512 // unit`` tokens, lengths are divided by ``unit``),
so a 61M-token trace replays in minutes; a page of ``p`` replayed tokens is a page of ``p * unit``
trace tokens.  Outputs are fresh tokens (the trace's next turn names its own blocks).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

BLOCK = 512  # trace tokens per hash id
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"


@dataclass(frozen=True)
class TraceRequest:
    """One request of a Mooncake-format trace."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def load(path: Path | str = DEFAULT_TRACE, limit: int | None = None) -> list[TraceRequest]:
    """The trace's requests in file order; a clear error when the file is missing or malformed."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no trace at {path} (pass --trace PATH to a Mooncake-format .jsonl)")
    out = []
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                req = TraceRequest(
                    float(d["timestamp"]),
                    int(d["input_length"]),
                    int(d["output_length"]),
                    tuple(d["hash_ids"]),
                )
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not a Mooncake trace line ({e})") from None
            out.append(req)
            if limit is not None and len(out) >= limit:
                break
    return out


def halves(reqs: list[TraceRequest]) -> tuple[list[TraceRequest], list[TraceRequest]]:
    """The trace cut in two by time (the first half's blocks may come back in the second)."""
    mid = (reqs[0].timestamp_ms + reqs[-1].timestamp_ms) / 2
    return [r for r in reqs if r.timestamp_ms <= mid], [r for r in reqs if r.timestamp_ms > mid]


def materialise(
    reqs: list[TraceRequest], unit: int = 16, vocab: int = 50_000, seed: int = 0
) -> list[tuple[list[int], list[int]]]:
    """``(prompt, output)`` token lists, ``unit`` trace tokens per token (see the module docstring)."""
    if BLOCK % unit:
        raise ValueError(f"unit must divide the {BLOCK}-token block, got {unit}")
    per_block = BLOCK // unit
    blocks: dict[int, list[int]] = {}
    rng = random.Random(seed)
    trace = []
    for r in reqs:
        n = max(1, -(-r.input_length // unit))
        prompt: list[int] = []
        for h in r.hash_ids:
            if h not in blocks:
                blocks[h] = [rng.randrange(3, vocab) for _ in range(per_block)]
            prompt += blocks[h]
            if len(prompt) >= n:
                break
        prompt = (
            prompt[:n]
            if len(prompt) >= n
            else prompt + [rng.randrange(3, vocab) for _ in range(n - len(prompt))]
        )
        output = [rng.randrange(3, vocab) for _ in range(max(1, -(-r.output_length // unit)))]
        trace.append((prompt, output))
    return trace
