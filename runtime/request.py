"""A request's life in the engine, and what callers get back."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from runtime.cache.scope import PUBLIC, CacheScope
from runtime.sampling.constrained.matcher import Matcher
from runtime.sampling.params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """Tokens, KV pages and progress of one sequence.

    ``tokens`` is prompt + output so far.  ``num_computed`` tokens have K/V in ``pages``;
    the first ``num_tree_pages`` pages belong to the prefix cache (locked through its
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
    handle: object = None  # the prefix cache's handle on the cached part, while admitted
    scope: CacheScope = PUBLIC  # tenant namespace, public prefix, session (runtime/cache/scope.py)
    num_computed: int = 0
    cached_tokens: int = -1  # -1 until first admitted
    cached_host_tokens: int = 0  # of cached_tokens: loaded from the host tier
    cached_disk_tokens: int = 0  # of cached_tokens: loaded from the disk tier
    tier_load_s: float = 0.0  # engine-thread time copying those pages into the pool (read-ahead excluded)
    snapshot_cut: int = 0  # hybrids: KV-matched tokens recomputed for want of a state snapshot
    prefilled_tokens: int = 0
    finish_reason: str | None = None
    arrival: float = field(default_factory=time.perf_counter)
    admitted_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    retractions: int = 0
    logprobs: list = field(default_factory=list)
    matcher: Matcher | None = None  # grammar state (params.grammar); advanced by the scheduler on commit

    def __post_init__(self) -> None:
        # one copy of the prompt shared by every output snapshot (never mutated)
        self.prompt_ids: list[int] = self.tokens[: self.num_prompt]

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
    """What one step produced for a request: the new tokens and text, plus accounting so far.

    Built from deltas, so an output costs the same whatever the prompt and output length.  The
    final output (``finished``) also carries the whole output (``output_token_ids``, ``text``,
    ``logprobs``); on the others those are empty.  ``prompt_token_ids`` is one list shared by all
    outputs of a request: read it, do not change it.
    """

    request_id: str
    prompt_token_ids: list[int]
    new_token_ids: list[int]
    delta: str
    new_logprobs: list
    finished: bool
    finish_reason: str | None
    cached_tokens: int
    prefilled_tokens: int
    ttft_s: float | None
    prefill_s: float | None
    decode_s: float | None
    e2e_s: float | None
    output_token_ids: list[int] = []
    text: str = ""
    logprobs: list = []
    error: str | None = None
    cached_host_tokens: int = 0  # of cached_tokens, loaded from the host tier
    cached_disk_tokens: int = 0  # of cached_tokens, loaded from the disk tier
    tier_load_s: float = (
        0.0  # time the engine spent loading them into the pool (background read-ahead excluded)
    )
    snapshot_cut: int = 0  # hybrids: KV-matched prompt tokens recomputed after the last state snapshot

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)
