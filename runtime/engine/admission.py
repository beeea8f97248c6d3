"""Admission: a prompt checked against the model and the pool, then turned into a ``Request``.

Runs in the caller's thread (a server handler, ``Engine.make_request``) and has no side effect until
``make`` draws a seed, so a server can refuse a request before its response starts.
"""

from __future__ import annotations

import itertools

import torch

from kvreuse.runtime.loading.tokenizer import text_prompt_ids
from kvreuse.runtime.request import PUBLIC, CacheScope, Request
from kvreuse.runtime.sampling.constrained import GrammarBusy, GrammarCompiler, GrammarError
from kvreuse.runtime.sampling.draws import Draws, fresh_seed
from kvreuse.runtime.sampling.params import SamplingParams


class EngineError(ValueError):
    """A request the engine cannot serve; the message says why in one line, ``code`` says what kind
    (an OpenAI error code such as ``context_length_exceeded``, or None)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class Admission:
    """Validates prompts and builds requests for one engine: its tokenizer, vocabulary, context
    length, KV capacity and grammar cache."""

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        max_model_len: int,
        kv_capacity_tokens: int,
        eos_ids: frozenset[int],
        grammars: GrammarCompiler,
        seed: int | None,
    ) -> None:
        self.tokenizer, self.vocab_size, self.eos_ids = tokenizer, vocab_size, eos_ids
        self.max_model_len, self.kv_capacity_tokens = max_model_len, kv_capacity_tokens
        self.grammars = grammars
        self._ids = itertools.count()
        # an unseeded request's seed: the OS's entropy, per request (no stream a tenant could read or
        # move); only an engine given a seed (in-process, reproducible runs) shares one stream
        self._seed_rng = torch.Generator().manual_seed(seed) if seed is not None else None

    @property
    def token_capacity(self) -> int:
        """The most tokens (prompt + output) one request can have: context length and KV pool both."""
        return min(self.max_model_len, self.kv_capacity_tokens)

    def _seed(self) -> int:
        if self._seed_rng is None:
            return fresh_seed()
        return int(torch.randint(0, 2**62, (1,), generator=self._seed_rng))

    def validate(
        self, prompt: str | list[int], params: SamplingParams, scope: CacheScope = PUBLIC
    ) -> list[int]:
        """Tokenise and check a prompt; raises EngineError with a one-line reason.  A grammar compiles
        in ``scope``'s tenant's cache (a hit must not tell one tenant what another compiled)."""
        try:
            ids = text_prompt_ids(self.tokenizer, prompt) if isinstance(prompt, str) else list(prompt)
        except Exception as e:  # e.g. a lone surrogate: the tokenizer's TypeError is the caller's problem
            raise EngineError(f"the prompt cannot be tokenised: {e}".splitlines()[0][:300]) from None
        if not ids:
            raise EngineError("the prompt is empty")
        vocab = self.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise EngineError(f"prompt token ids must be in [0, {vocab})")
        if params.logit_bias and not all(0 <= t < vocab for t in params.logit_bias):
            raise EngineError(f"logit_bias token ids must be in [0, {vocab})")
        if params.grammar is not None:
            try:
                self.grammars.compiled(params.grammar, scope.namespace)  # later requests hit the cache
            except GrammarBusy as e:
                raise EngineError(str(e), "grammar_busy") from None
            except GrammarError as e:
                raise EngineError(str(e)) from None
        total = len(ids) + params.max_tokens
        for limit, what, hint in (
            (self.max_model_len, "the model's context length", ""),
            (self.kv_capacity_tokens, "the KV cache", "; raise --kv-cache-memory"),
        ):
            if total > limit:
                raise EngineError(
                    f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds "
                    f"{what} ({limit} tokens){hint}",
                    "context_length_exceeded",
                )
        return ids

    def make(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        scope: CacheScope = PUBLIC,
    ) -> Request:
        """A validated request, complete: its cache ``scope`` and its sampling generator seeded (from
        ``params.seed``, else the OS's entropy).  The one place a prompt is checked."""
        ids = self.validate(prompt, params, scope)
        draws = None
        if not params.greedy:
            draws = Draws(params.seed if params.seed is not None else self._seed())
        rid = request_id or f"req-{next(self._ids)}"
        req = Request(rid, ids, len(ids), params, self.eos_ids, draws=draws, scope=scope)
        if params.grammar is not None:
            req.matcher = self.grammars.matcher(params.grammar, params.max_tokens, scope.namespace)
        return req
