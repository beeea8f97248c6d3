"""Compile each grammar once (per engine), and give every request its own matcher from the compiled one."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

import torch

from runtime.sampling.constrained.matcher import Matcher
from runtime.sampling.constrained.spec import Grammar

CACHE_SIZE = 256


class GrammarError(ValueError):
    """A grammar (usually a JSON schema) that cannot be compiled; the message says why in one line."""


class GrammarCompiler:
    """LRU cache ``Grammar -> compiled matcher``; ``matcher()`` deep-copies the compiled one per request.

    The llguidance tokenizer (about 1 s to build for a 49K vocabulary) is built on the first grammar,
    so engines that never see one pay nothing.  Thread-safe: the server compiles in its own thread.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: frozenset[int]) -> None:
        self._hf_tokenizer, self.vocab_size, self.eos_ids = tokenizer, vocab_size, eos_ids
        self._tokenizer: Any = None
        self._closers: list[torch.Tensor] | None = None
        self._cache: OrderedDict[Grammar, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.compile_s: dict[
            str, float
        ] = {}  # label of the last compile of each kind -> seconds (benchmarks)
        self.compiles = 0

    def _llg_tokenizer(self) -> Any:
        if self._tokenizer is None:
            import llguidance.hf

            self._tokenizer = llguidance.hf.from_tokenizer(
                self._hf_tokenizer, n_vocab=self.vocab_size, eos_token=sorted(self.eos_ids)
            )
        return self._tokenizer

    def compiled(self, grammar: Grammar) -> Any:
        """The compiled matcher for ``grammar`` (raises GrammarError)."""
        with self._lock:
            m = self._cache.get(grammar)
            if m is not None:
                self._cache.move_to_end(grammar)
                return m
            import llguidance

            tokenizer = self._llg_tokenizer()
            t0 = time.perf_counter()
            m = llguidance.LLMatcher(tokenizer, grammar.source, log_level=0)
            if m.is_error():
                raise GrammarError(f"{grammar.label}: {_first_line(m.get_error())}")
            self.compile_s[grammar.label] = time.perf_counter() - t0
            self.compiles += 1
            self._cache[grammar] = m
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return m

    def matcher(self, grammar: Grammar, budget: int | None = None) -> Matcher:
        """A fresh matcher at the grammar's start, for one request of at most ``budget`` tokens."""
        compiled = self.compiled(grammar)
        with self._lock:
            if self._closers is None:
                texts = [self._hf_tokenizer.decode([i]).strip() for i in range(self.vocab_size)]
                self._closers = [
                    _bitmask([i for i, t in enumerate(texts) if i in self.eos_ids or ok(t)], self.vocab_size)
                    for ok in (_ends_string, _closes_container)
                ]
            return Matcher(compiled.deep_copy(), self.eos_ids, budget, self._closers)


def _bitmask(ids: list[int], vocab_size: int) -> torch.Tensor:
    words = torch.zeros((vocab_size + 31) // 32, dtype=torch.int64)
    for i in ids:
        words[i // 32] |= 1 << (i % 32)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def _ends_string(text: str) -> bool:
    return text.startswith('"') and all(c in "}]" for c in text[1:])


def _closes_container(text: str) -> bool:
    return bool(text) and all(c in "}]" for c in text)


def _first_line(msg: str) -> str:
    lines = [ln.strip() for ln in str(msg).strip().splitlines() if ln.strip()]
    return lines[0] if lines else "invalid grammar"
