"""Sampling settings from a request body, and OpenAI-shaped logprobs and usage."""

from __future__ import annotations

from typing import Any

from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.sampling.params import SamplingParams
from kvreuse.runtime.server.errors import bad_request
from kvreuse.runtime.server.openai.protocol import ChatCompletionRequest, CompletionRequest


def sampling_params(
    req: ChatCompletionRequest | CompletionRequest, engine: Engine, prompt_len: int, choice: int = 0
) -> SamplingParams:
    """``choice`` offsets the seed so the n choices of a seeded request differ but are reproducible."""
    if isinstance(req, ChatCompletionRequest):
        max_tokens = req.max_completion_tokens or req.max_tokens
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
    else:
        max_tokens, logprobs = req.max_tokens, req.logprobs
    if max_tokens is None:  # OpenAI's default: up to the end of the context
        max_tokens = max(1, engine.admission.token_capacity - prompt_len)
    seed = None if req.seed is None else (req.seed + choice) % (2**63)
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=-1 if req.top_k is None else req.top_k,
            seed=seed,
            stop=req.stop,
            stop_token_ids=list(req.stop_token_ids or []),
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
        )
    except ValueError as e:
        raise bad_request(str(e)) from None


def _token_text(tokenizer: Any, tid: int) -> str:
    return tokenizer.decode([tid])


def chat_logprobs(tokenizer: Any, entries: list) -> dict[str, Any]:
    content = []
    for tid, (lp, alts) in entries:
        text = _token_text(tokenizer, tid)
        top = [
            {"token": (t := _token_text(tokenizer, a)), "logprob": alp, "bytes": list(t.encode())}
            for a, alp in alts
        ]
        content.append({"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": top})
    return {"content": content}


def completion_logprobs(tokenizer: Any, entries: list, offset: int = 0) -> dict[str, Any]:
    """Legacy completions logprobs; ``top_logprobs`` holds the chosen token too (so ``logprobs=0``
    gives one entry, the chosen token).  An entry ``(tid, None)`` is a token without a logprob (the
    first token of an echoed prompt): null in both lists."""
    tokens, lps, tops, offsets = [], [], [], []
    pos = offset
    for tid, info in entries:
        text = _token_text(tokenizer, tid)
        tokens.append(text)
        offsets.append(pos)
        pos += len(text)
        if info is None:
            lps.append(None)
            tops.append(None)
            continue
        lp, alts = info
        lps.append(lp)
        top = {_token_text(tokenizer, a): alp for a, alp in alts}
        top.setdefault(text, lp)
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}
