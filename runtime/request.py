"""A request's life in the engine: its tokens, pages, progress, when it is done, and whose cache it
uses (``CacheScope``, built once with the request and never changed)."""

from __future__ import annotations

import enum
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import NamedTuple

from kvreuse.runtime.sampling.constrained.matcher import Matcher
from kvreuse.runtime.sampling.draws import Draws
from kvreuse.runtime.sampling.params import SamplingParams


# Who a request's cache belongs to: its tenant's namespace, the public prefix, its session.
#
# The server derives all of it (from the API key and the request); a client never names a
# namespace.  In the radix tree a namespace is part of every child key, so a request can only
# match prefixes computed under its own namespace, except for its first ``public_len`` tokens
# (page-aligned down), which are matched and stored in the shared public namespace (``None``):
# a system prompt every tenant sends can be computed once without letting one tenant probe
# another's history.  Without tenants everything lives in the public namespace.
class CacheScope(NamedTuple):
    """``namespace``: the tenant (``None``: public); ``public_len``: leading tokens shared publicly;
    ``session``: the pin owner whose last node stays cached (``runtime/cache/pins.py``)."""

    namespace: Hashable | None = None
    public_len: int = 0
    session: Hashable | None = None


PUBLIC = CacheScope()


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
    draws: Draws | None = None  # a sampled request's randomness by output position (None: greedy)
    status: Status = Status.WAITING
    pages: list[int] = field(default_factory=list)
    num_tree_pages: int = 0
    handle: object = None  # the prefix cache's handle on the cached part, while admitted
    scope: CacheScope = PUBLIC  # tenant namespace, public prefix, session (``CacheScope`` above)
    num_computed: int = 0
    cached_tokens: int = -1  # -1 until first admitted
    cached_host_tokens: int = 0  # of cached_tokens: loaded from the host tier
    cached_disk_tokens: int = 0  # of cached_tokens: loaded from the disk tier
    cached_shared_tokens: int = 0  # of cached_tokens: loaded from the shared tier (other replicas' pages)
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
    drafted_tokens: int = 0  # speculative decoding: tokens drafted for this request and verified
    accepted_tokens: int = 0  # of those, accepted (emitted without a step of their own)

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

    def drop_tail(self, n: int) -> None:
        """Forget the last ``n`` output tokens (appended in one step after a token that stopped the
        request): their KV, if computed, is past ``num_computed`` and so never cached."""
        if n <= 0:
            return
        del self.tokens[len(self.tokens) - n :]
        if self.params.logprobs is not None:
            del self.logprobs[len(self.logprobs) - n :]
        self.num_computed = min(self.num_computed, len(self.tokens))

    def stop_reason(self, token: int, text_stopped: bool = False, after: int = 0) -> str | None:
        """Why the request ends with ``token`` just appended, or None: the one place a stop is decided.

        ``grammar_error``: the request's grammar failed (its output does not validate).

        ``text_stopped``: the detokeniser found a stop string.  A stop (a stop string, an EOS or stop
        token) wins over ``length`` when both happen on the same token.  Admission has checked that
        prompt + ``max_tokens`` fits the context, so ``max_tokens`` is the only length limit.
        ``after``: tokens appended in the same step after ``token`` (an accepted draft), not counted.
        """
        p = self.params
        if self.matcher is not None and self.matcher.error is not None:
            # the grammar library gave up (a schema past its limits): whatever was generated does not
            # validate, so the stop must not read as a normal one (issue 39)
            return "grammar_error"
        if text_stopped or (token in self.eos_ids and not p.ignore_eos) or token in p.stop_token_ids:
            return "stop"
        if len(self.tokens) - after - self.num_prompt >= p.max_tokens:
            return "length"
        return None
