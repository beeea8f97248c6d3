"""Compile each grammar once (per engine), and give every request its own matcher from the compiled one."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Hashable
from typing import Any

import torch

from kvreuse.runtime.sampling.constrained.matcher import Matcher
from kvreuse.runtime.sampling.constrained.spec import Grammar

CACHE_SIZE = 256
log = logging.getLogger("kvreuse.grammar")


class GrammarError(ValueError):
    """A grammar (usually a JSON schema) that cannot be compiled; the message says why in one line."""


class GrammarBusy(GrammarError):
    """This tenant already has as many compiles running as it may (one still running past its budget
    included): retry later."""


COMPILE_TIMEOUT_S = 5.0
# A compile is preparation, not serving: it runs below the engine's threads, so a burst of compiles
# takes the CPU time the engine leaves instead of stalling its intra-op threads at every barrier
# (the server's prep threads run at the same level: runtime/server/prep.py).
BACKGROUND_NICE = 10
COMPILES_PER_TENANT = 2  # distinct grammars of one tenant compiling at once, abandoned ones included


class GrammarCompiler:
    """LRU cache ``(tenant, Grammar) -> compiled matcher``; ``matcher()`` deep-copies the compiled one.

    The llguidance tokenizer (about 1 s to build for a 49K vocabulary) is built on the first grammar,
    so engines that never see one pay nothing.  Thread-safe, and no lock is held while compiling
    (llguidance releases the GIL), so one tenant's slow schema never delays another's compile.

    * The cache is keyed by the tenant's namespace: a hit is faster than a compile, so a shared cache
      would let one tenant confirm another's schema by timing (issue 39).  Full, it drops the oldest
      grammar of the tenant holding the most, so another tenant's flood never evicts yours (issue 51).
    * A compile runs in a thread of its own; one over ``timeout_s`` is abandoned (a ``GrammarError``
      naming the grammar, a 400).  A thread cannot be killed, so the abandoned compile runs on and its
      result is still cached for that tenant; it is reniced to the lowest priority, so it only
      takes CPU time the engine and the event loop leave; and each tenant may have only ``per_tenant`` compiles
      running at once, abandoned ones included (``GrammarBusy``, a 429): one tenant's runaway schemas
      occupy at most that many cores.  Requests with a grammar already compiling wait for that
      compile (20 concurrent requests with one new tool set compile it once).
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_ids: frozenset[int],
        timeout_s: float = COMPILE_TIMEOUT_S,
        per_tenant: int = COMPILES_PER_TENANT,
    ) -> None:
        self._hf_tokenizer, self.vocab_size, self.eos_ids = tokenizer, vocab_size, eos_ids
        self.timeout_s, self.per_tenant = timeout_s, per_tenant
        self._tokenizer: Any = None
        self._tokenizer_error: str | None = None  # llguidance refused the tokenizer: each grammar's 400
        self._closers: list[torch.Tensor] | None = None
        self._cache: OrderedDict[tuple[Hashable, Grammar], Any] = OrderedDict()
        self._running: Counter[Hashable] = Counter()  # compiles in flight per tenant, abandoned included
        self._inflight: dict[tuple[Hashable, Grammar], tuple[threading.Event, list]] = {}
        self._lock = threading.Lock()
        self._tokenizer_lock = threading.Lock()
        self.compile_s: dict[
            str, float
        ] = {}  # label of the last compile of each kind -> seconds (benchmarks)
        self.compiles = 0
        self.abandoned = 0

    def _llg_tokenizer(self) -> Any:
        """The llguidance tokenizer, built once; a GrammarError (a 400) where llguidance refuses it."""
        with self._tokenizer_lock:
            if self._tokenizer is None and self._tokenizer_error is None:
                import llguidance.hf

                try:
                    self._tokenizer = llguidance.hf.from_tokenizer(
                        self._hf_tokenizer, n_vocab=self.vocab_size, eos_token=sorted(self.eos_ids)
                    )
                except Exception as e:  # llguidance raises plain exceptions for tokenizers it cannot take
                    self._tokenizer_error = f"constrained decoding is unavailable for this model's tokenizer: {_first_line(str(e))}"
            if self._tokenizer_error is not None:  # the refusal, said again on each grammar request
                raise GrammarError(self._tokenizer_error)
            return self._tokenizer

    def warm(self) -> None:
        """Build the llguidance tokenizer and the wrap-up masks now.  Both are Python and Rust holding the
        GIL (the tokenizer about 1 s), so built on a server's first grammar they stall every tenant's
        requests and ``/health`` at once (benchmarks/serving/fairness.py); ``kvreuse serve`` builds them before
        it listens.  A tokenizer llguidance
        refuses (e.g. more tokens than the model's vocabulary) is not an error here: the server serves
        without grammars, and each grammar request says why in its 400."""
        try:
            self._llg_tokenizer()
        except GrammarError as e:
            log.warning("%s", e)
            return
        with self._lock:
            self._closer_masks()

    def in_flight(self) -> int:
        """Compiles still running, abandoned ones included (they finish in the background)."""
        with self._lock:
            return sum(self._running.values())

    def compiled(self, grammar: Grammar, tenant: Hashable = None) -> Any:
        """The compiled matcher for ``grammar`` in ``tenant``'s cache (raises GrammarError)."""
        key = (tenant, grammar)
        tokenizer = self._llg_tokenizer()  # built once (about 1 s), outside the compile budget
        with self._lock:
            m = self._cache.get(key)
            if m is not None:
                self._cache.move_to_end(key)
                return m
            inflight = self._inflight.get(key)
            if inflight is None:  # the same grammar already compiling is waited for, not compiled again
                if self._running[tenant] >= self.per_tenant:
                    raise GrammarBusy(
                        f"{grammar.label}: another grammar of this caller is still compiling; retry shortly"
                    )
                self._running[tenant] += 1
                inflight = self._inflight[key] = (threading.Event(), [])
                self._start(key, grammar, tokenizer, *inflight)
        done, box = inflight
        return self._wait(grammar, done, box)

    def _start(
        self,
        key: tuple[Hashable, Grammar],
        grammar: Grammar,
        tokenizer: Any,
        done: threading.Event,
        box: list,
    ) -> None:
        """Compile in a thread of its own; ``box`` gets its native id, then the result or the error."""
        tenant = key[0]

        def compile_it() -> None:
            import llguidance

            box.append(threading.get_native_id())
            renice(box[0], BACKGROUND_NICE)
            try:
                t0 = time.perf_counter()
                m = llguidance.LLMatcher(tokenizer, grammar.source, log_level=0)
                # the first mask builds the grammar's lexer states, which the copies handed to requests
                # share only if the compiled matcher built them: computed here, below the engine, each
                # request's first mask on the engine step is cheap instead of a fresh build per request
                m.compute_bitmask()
                check_forced_start(m)
                box.append((m, time.perf_counter() - t0))
                if not m.is_error():
                    with self._lock:
                        self.compile_s[grammar.label] = box[1][1]
                        self.compiles += 1
                        self._cache[key] = m
                        if len(self._cache) > CACHE_SIZE:
                            self._evict()
            except Exception as e:  # llguidance refuses some inputs by raising
                box.append(e)
            finally:
                with self._lock:
                    self._running[tenant] -= 1
                    self._inflight.pop(key, None)
                done.set()

        threading.Thread(target=compile_it, name="kvreuse-grammar", daemon=True).start()

    def _wait(self, grammar: Grammar, done: threading.Event, box: list) -> Any:
        """The compile's result within the budget, else abandon it (a GrammarError)."""
        if not done.wait(self.timeout_s):
            with self._lock:
                self.abandoned += 1
            renice(box[0], 19)  # it runs on, but only on CPU time the engine does not want
            raise GrammarError(
                f"{grammar.label}: compiling the grammar took longer than {self.timeout_s:g} s "
                "(--grammar-compile-timeout); simplify the schema"
            )
        if isinstance(box[1], Exception):
            raise GrammarError(f"{grammar.label}: {_first_line(str(box[1]))}")
        m = box[1][0]
        if m.is_error():
            raise GrammarError(f"{grammar.label}: {_first_line(m.get_error())}")
        return m

    def _evict(self) -> None:
        """Drop the least recently used grammar of the tenant holding the most (under ``_lock``): one
        tenant compiling many schemas pushes out its own, never another's within its share."""
        held = Counter(t for t, _ in self._cache)
        top = max(held, key=held.__getitem__)
        del self._cache[next(k for k in self._cache if k[0] == top)]

    def matcher(self, grammar: Grammar, budget: int | None = None, tenant: Hashable = None) -> Matcher:
        """A fresh matcher at the grammar's start, for one request of at most ``budget`` tokens."""
        compiled = self.compiled(grammar, tenant)
        with self._lock:
            wrap_up = None if grammar.free_text else budget  # no JSON to close in prose
            return Matcher(compiled.deep_copy(), self.eos_ids, wrap_up, self._closer_masks())

    def _closer_masks(self) -> list[torch.Tensor]:
        """The matcher's wrap-up tiers, built once (under ``_lock``): decoding every token is a Python
        loop holding the GIL, so ``warm`` builds them before a server listens, like the tokenizer."""
        if self._closers is None:
            texts = [self._hf_tokenizer.decode([i]).strip() for i in range(self.vocab_size)]
            self._closers = [
                _bitmask([i for i, t in enumerate(texts) if i in self.eos_ids or ok(t)], self.vocab_size)
                for ok in (_ends_string, _closes_container)
            ]
        return self._closers


def check_forced_start(m: Any) -> None:
    """Follow the start every output of ``m``'s grammar shares, on a copy (llguidance bounds how far).
    A grammar whose forced start the library cannot follow (a pattern like ``a{1000000}``, a schema
    requiring itself forever) is refused here, at compile time (a 400): compiled as it was, each
    request ended after ``{"`` with ``grammar_error``."""
    probe = m.deep_copy()
    forced = probe.compute_ff_tokens()
    if forced:
        probe.consume_tokens(forced)
    if probe.is_error():
        raise ValueError(
            f"no output valid against it can be generated ({_first_line(probe.get_error())}); "
            "simplify the schema"
        )


def renice(native_id: int, nice: int) -> None:
    """Renice one thread (a Linux thread is a task with its own nice value); elsewhere a no-op."""
    try:
        os.setpriority(os.PRIO_PROCESS, native_id, nice)
    except (AttributeError, OSError):
        pass


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
