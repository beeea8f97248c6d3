"""Timing helpers shared by the two sides of ``kvreuse.benchmarks.kernels.gpu_bench`` (kvreuse and transformers)."""

from __future__ import annotations

import statistics
import time

import torch

CACHED_SUFFIX = 256  # new tokens after a cached prefix: a new turn of an agent's conversation (at most 1/4)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prompt(n: int, salt: int, vocab: int) -> list[int]:
    """Deterministic random token ids, so both implementations see the same prompts."""
    g = torch.Generator().manual_seed(n * 1000 + salt)
    return torch.randint(10, vocab, (n,), generator=g).tolist()


def suffix_len(context: int) -> int:
    return min(CACHED_SUFFIX, context // 4)


def timed(device: torch.device, fn) -> tuple[float, object]:
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t, out


def decode_row(batch: int, ctx: int, step_s: list[float], tokens_batch0: list[int]) -> dict:
    """Rate from the median step (robust to a one-off kernel compile) and from the total."""
    med = statistics.median(step_s)
    return {"batch": batch, "context": ctx, "steps": len(step_s), "median_step_ms": med * 1e3,
            "tokens_per_s": batch / med, "tokens_per_s_mean": batch * len(step_s) / sum(step_s),
            "tokens_batch0": tokens_batch0}  # fmt: skip
