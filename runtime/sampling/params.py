"""Per-request sampling settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvreuse.runtime.sampling.constrained.spec import Grammar

# Below this a temperature is greedy: fp32 logits (|x| < ~1e3) over 1e-5 stay far from overflow,
# and the distribution is already one-hot to fp32 precision.  vLLM uses the same cut-off.
MIN_TEMPERATURE = 1e-5


@dataclass
class SamplingParams:
    """What to generate and when to stop; ``temperature < MIN_TEMPERATURE`` (e.g. 0) means greedy."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top alternatives to return per token (0 = chosen token only)
    logit_bias: dict[int, float] | None = None  # added to the logits before sampling (token id -> bias)
    grammar: Grammar | None = None  # constrained decoding: every output token must keep the grammar valid
    # Forced decoding: the i-th generated token is forced_tokens[i] whatever the logits say (then normal
    # sampling resumes). Replaying a known reply this way caches its KV exactly as a real generation would.
    forced_tokens: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if len(self.forced_tokens) > self.max_tokens:
            raise ValueError(f"{len(self.forced_tokens)} forced tokens exceed max_tokens={self.max_tokens}")

    def forced_at(self, i: int, sampled: int) -> int:
        """The token to emit as generated token ``i``: the forced one while any are left, else ``sampled``."""
        return self.forced_tokens[i] if i < len(self.forced_tokens) else sampled

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE or self.top_k == 1
