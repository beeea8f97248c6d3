"""A request's life in the engine, and what callers get back."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from runtime.constrained.matcher import Matcher
from runtime.radix_cache import TreeNode
from runtime.sampling import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """Tokens, KV pages and progress of one sequence.

    ``tokens`` is prompt + output so far.  ``num_computed`` tokens have K/V in ``pages``;
    the first ``num_tree_pages`` pages belong to the radix tree (locked through
    ``handle``), the rest are the request's own::

        tokens : | prompt ...................... | output ... |
        pages  : [ tree | tree | own | own | own ]
                 ^-- num_tree_pages*page_size   ^-- num_computed <= len(tokens)
    """

    request_id: str
    tokens: list[int]
    num_prompt: int
    params: SamplingParams
    eos_ids: frozenset[int]
    generator: torch.Generator | None = None
    status: Status = Status.WAITING
    pages: list[int] = field(default_factory=list)
    num_tree_pages: int = 0
    handle: TreeNode | None = None
    num_computed: int = 0
    cached_tokens: int = -1  # -1 until first admitted
    prefilled_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    arrival: float = field(default_factory=time.perf_counter)
    admitted_time: float | None = None
    first_token_time: float | None = None
    prefill_done_time: float | None = None
    finish_time: float | None = None
    retractions: int = 0
    logprobs: list = field(default_factory=list)
    logits_trace: list[torch.Tensor] | None = None  # filled when the engine records logits (tests)
    matcher: Matcher | None = None  # grammar state (params.grammar); advanced by the engine on each token

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.num_prompt :]

    @property
    def remaining(self) -> int:
        return len(self.tokens) - self.num_computed

    @property
    def own_pages(self) -> list[int]:
        return self.pages[self.num_tree_pages :]


class RequestOutput(NamedTuple):
    """Snapshot of a request: the whole output so far plus this step's text delta."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    text: str
    delta: str
    finished: bool
    finish_reason: str | None
    cached_tokens: int
    prefilled_tokens: int
    ttft_s: float | None
    prefill_s: float | None
    decode_s: float | None
    e2e_s: float | None
    logprobs: list
    error: str | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)
