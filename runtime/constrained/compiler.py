"""Compile each grammar once (per engine), and give every request its own matcher from the compiled one."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from runtime.constrained.matcher import Matcher
from runtime.constrained.spec import Grammar

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

    def matcher(self, grammar: Grammar) -> Matcher:
        """A fresh matcher at the grammar's start, for one request."""
        compiled = self.compiled(grammar)
        with self._lock:
            return Matcher(compiled.deep_copy(), self.eos_ids)


def _first_line(msg: str) -> str:
    lines = [ln.strip() for ln in str(msg).strip().splitlines() if ln.strip()]
    return lines[0] if lines else "invalid grammar"
