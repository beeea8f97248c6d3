"""What a hybrid model's prefix cache should reuse, derived from the documented snapshot policy alone.

A hybrid (Qwen3.5) resumes a prefix only where a linear-attention state snapshot ends
(``runtime/cache/state_slots.py``).  Snapshots are taken at page boundaries: the last one of every prefill
chunk, every ``every_pages`` pages, the end of a KV match that was cut back (a divergence point), and
the last one a request's decode reached.  Replaying that rule over the benchmark's own token streams
(requests run one at a time, so chunk ``i`` of request ``j`` is ``[c_j + i*C, c_j + (i+1)*C)``) gives,
per request, the KV match (whole pages shared with an earlier computed stream, as for a dense model)
and the part of it before the last snapshot: the cached tokens the engine must report.  The checks
compare those with what the engine measured, so a bound that allows "up to the last snapshot" is only
as loose as the policy says, and a real miss still fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from kvreuse.benchmarks.patterns.ideal import best_prefix, computed_streams


class SnapshotPolicy(NamedTuple):
    """The engine's snapshot placement (``kvreuse.runtime.engine.states.snapshot_policy``)."""

    page_size: int
    chunk_size: int
    every_pages: int


class Expected(NamedTuple):
    """Per request: KV-matched tokens, of which ``cached`` end at a snapshot; ``cut`` = kv - cached."""

    kv: int
    cached: int
    cut: int


def request_points(p: SnapshotPolicy, cached: int, prompt_len: int, computed: int, fork: int) -> set[int]:
    """Token counts after which request's states are snapshotted (prefill chunks, forks, decode end)."""
    ps, points = p.page_size, set()
    every = p.every_pages * ps
    for start in range(cached, prompt_len, p.chunk_size):
        end = min(start + p.chunk_size, prompt_len)
        last = end - end % ps
        if last > start:
            points.add(last)
        if every:
            points.update(n for n in range(start - start % ps + ps, end + 1, ps) if n % every == 0)
        if start < fork <= end:
            points.add(fork)
    decode_end = computed - computed % ps
    if decode_end > prompt_len:  # the last page boundary decode reached, kept when the request leaves
        points.add(decode_end)
    return points


def expected_reuse(
    p: SnapshotPolicy, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]
) -> list[Expected]:
    """The policy's prediction for every request of a run that starts from an empty cache."""
    ps = p.page_size
    streams = computed_streams(prompts, outputs)
    kept: list[tuple[int, tuple[int, ...]]] = []  # (n, stream[:n]) of every snapshot so far
    out = []
    for k, prompt in enumerate(prompts):
        limit = len(prompt) - 1  # the last prompt token is always computed (its logits)
        shared = best_prefix(prompt, streams[:k])
        kv = min(shared, limit) // ps * ps
        head = tuple(prompt[:kv])
        cached = max((n for n, pre in kept if n <= kv and head[:n] == pre), default=0)
        out.append(Expected(kv, cached, kv - cached))
        fork = kv if kv > cached else 0
        for n in request_points(p, cached, len(prompt), len(streams[k]), fork):
            kept.append((n, tuple(streams[k][:n])))
    return out
