"""What a session costs: money under published cached-input price rules, and prefill FLOPs.

Money uses the measured per-request cached / prefilled / generated counts.  Both providers cache at
their own granularity (Anthropic at explicit breakpoints, OpenAI in 128-token steps past 1,024 tokens);
our 16-token pages are finer, so the figures are the price of *these* token streams under each rule
table, not a bill.  FLOPs are for a reference dense model (Qwen3-8B's shape), not the tiny model
that produced the counts: a prefilled token at position p costs 2 * non-embedding params (the linear
layers) + 4 * layers * q_heads * head_dim * p (scores and values over the p tokens before it).
"""

from __future__ import annotations

from typing import NamedTuple


class PriceRule(NamedTuple):
    """Dollars per million tokens, and the multipliers a provider applies to cached input."""

    provider: str
    model: str
    input_per_mtok: float
    output_per_mtok: float
    cache_write: float  # x input price for input written to the cache (uncached input)
    cache_read: float  # x input price for cached input
    source: str


PRICE_RULES = [
    PriceRule("Anthropic", "Claude Sonnet 4.5", 3.0, 15.0, 1.25, 0.10,
              "docs.anthropic.com/en/docs/build-with-claude/prompt-caching (5-minute writes 1.25x, 1-hour "
              "writes 2x, reads 0.1x the base input price)"),
    PriceRule("OpenAI", "GPT-4.1", 2.0, 8.0, 1.0, 0.25,
              "openai.com/api/pricing and platform.openai.com/docs/guides/prompt-caching (automatic, no "
              "write premium, cached input 0.25x on GPT-4.1; 0.5x on GPT-4o, 0.1x on GPT-5)"),
]  # fmt: skip


class RefModel(NamedTuple):
    name: str
    layers: int
    q_heads: int
    head_dim: int
    nonembed_params: float


QWEN3_8B = RefModel("Qwen3-8B shape", 36, 32, 128, 6.95e9)


def session_dollars(rows: list[dict], rule: PriceRule, cache: bool = True) -> float:
    """One pattern run's price: uncached input at the write rate, cached at the read rate, output at its own."""
    total = 0.0
    for r in rows:
        cached = (r["cached_tokens"] or 0) if cache else 0
        fresh = r["prompt_tokens"] - cached
        total += (
            fresh * (rule.cache_write if cache else 1.0) + cached * rule.cache_read
        ) * rule.input_per_mtok
        total += r.get("generated_tokens", 0) * rule.output_per_mtok
    return total / 1e6


def prefill_flops(rows: list[dict], model: RefModel = QWEN3_8B) -> float:
    """Prefill FLOPs of the prefilled positions [cached, prompt) of every request."""
    per_pos = 4 * model.layers * model.q_heads * model.head_dim
    total = 0.0
    for r in rows:
        lo, hi = r["prompt_tokens"] - r["prefilled_tokens"], r["prompt_tokens"]
        n = hi - lo
        total += 2 * model.nonembed_params * n + per_pos * (lo + hi - 1) * n / 2
    return total
