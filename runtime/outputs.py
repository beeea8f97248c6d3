"""Build caller-facing snapshots of a request."""

from __future__ import annotations

from runtime.detokenizer import IncrementalDetokenizer
from runtime.request import Request, RequestOutput


def make_output(req: Request, detok: IncrementalDetokenizer, delta: str) -> RequestOutput:
    first = req.first_token_time
    end = req.finish_time
    return RequestOutput(
        request_id=req.request_id,
        prompt_token_ids=req.tokens[: req.num_prompt],
        output_token_ids=list(req.output_ids),
        text=detok.text if end is not None else detok.text[: detok.emitted],
        delta=delta,
        finished=end is not None,
        finish_reason=req.finish_reason,
        cached_tokens=max(req.cached_tokens, 0),
        prefilled_tokens=req.prefilled_tokens,
        ttft_s=None if first is None else first - req.arrival,
        prefill_s=None if first is None or req.admitted_time is None else first - req.admitted_time,
        decode_s=None if first is None or end is None else end - first,
        e2e_s=None if end is None else end - req.arrival,
        logprobs=list(req.logprobs),
        error=req.error,
        snapshot_cut=req.snapshot_cut,
    )
