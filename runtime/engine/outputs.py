"""Build caller-facing outputs of a request from this step's deltas.

A step's output carries only what is new (tokens, text, logprobs), so building it costs the same
however long the prompt and output are; only the final output copies the whole output once.
"""

from __future__ import annotations

from typing import NamedTuple

from kvreuse.runtime.engine.detokenizer import IncrementalDetokenizer
from kvreuse.runtime.request import Request


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
    cached_shared_tokens: int = 0  # of cached_tokens, loaded from the shared tier
    tier_load_s: float = (
        0.0  # time the engine spent loading them into the pool (background read-ahead excluded)
    )
    snapshot_cut: int = 0  # hybrids: KV-matched prompt tokens recomputed after the last state snapshot
    drafted_tokens: int = 0  # speculative decoding: tokens drafted and verified so far
    accepted_tokens: int = 0  # of those, accepted

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


def make_output(
    req: Request,
    detok: IncrementalDetokenizer,
    delta: str,
    new_tokens: int,
    error: str | None = None,
) -> RequestOutput:
    """The output of a step that added ``new_tokens`` tokens (0, 1, or an accepted draft's) and ``delta``
    text to ``req``."""
    first = req.first_token_time
    end = req.finish_time
    finished = end is not None
    new_ids = req.tokens[len(req.tokens) - new_tokens :] if new_tokens else []
    new_lps = (
        req.logprobs[len(req.logprobs) - new_tokens :]
        if new_tokens and req.params.logprobs is not None
        else []
    )
    return RequestOutput(
        request_id=req.request_id,
        prompt_token_ids=req.prompt_ids,
        new_token_ids=new_ids,
        delta=delta,
        new_logprobs=new_lps,
        finished=finished,
        finish_reason=req.finish_reason,
        cached_tokens=max(req.cached_tokens, 0),
        prefilled_tokens=req.prefilled_tokens,
        ttft_s=None if first is None else first - req.arrival,
        prefill_s=None if first is None or req.admitted_time is None else first - req.admitted_time,
        decode_s=None if first is None or end is None else end - first,
        e2e_s=None if end is None else end - req.arrival,
        output_token_ids=list(req.output_ids) if finished else [],
        text=detok.text if finished else "",
        logprobs=list(req.logprobs) if finished else [],
        error=error,
        cached_host_tokens=req.cached_host_tokens,
        cached_disk_tokens=req.cached_disk_tokens,
        cached_shared_tokens=req.cached_shared_tokens,
        tier_load_s=req.tier_load_s,
        snapshot_cut=req.snapshot_cut,
        drafted_tokens=req.drafted_tokens,
        accepted_tokens=req.accepted_tokens,
    )
