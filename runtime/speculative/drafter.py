"""Draft sources, chosen by ``--speculative``: ``off`` (``NoDrafts``), ``ngram`` (``PromptLookup``: the
request's own prompt + output) and ``suffix`` (``SuffixLookup``: that, and the recent sequences of
the same tenant).

A drafter sees token lists and a namespace, never a ``Request``: the scheduler asks it for a draft
(``propose``), reports what was accepted (``observe``) and hands it each finished sequence
(``finish``).  Tenants never see each other's history: the history is kept per namespace, the same
key the prefix cache separates tenants by.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from kvreuse.runtime.speculative.draft_length import DraftLength
from kvreuse.runtime.speculative.ngram_index import DEFAULT_NS, NgramIndex

MODES = ("off", "ngram", "suffix")
SEP = -1  # between sequences in a history: no query holds it, so no match spans two sequences
HISTORY_TOKENS = 1 << 18  # per tenant: recent prompts + outputs kept for drafting
HISTORY_TENANTS = 64  # tenants whose history is kept, least recently used dropped first


class NoDrafts:
    """``--speculative off``: every request decodes one token per step."""

    def propose(self, key: Hashable, tokens: Sequence[int], namespace: Hashable, limit: int) -> list[int]:
        return []

    def observe(self, key: Hashable, drafted: int, accepted: int) -> None:
        pass

    def finish(self, key: Hashable, tokens: Sequence[int], namespace: Hashable) -> None:
        pass


class _Own:
    """A request's own n-gram index and draft length."""

    def __init__(self, start: int, most: int) -> None:
        self.index = NgramIndex(DEFAULT_NS)
        self.length = DraftLength(start, most)


class PromptLookup:
    """Prompt lookup: the longest recent n-gram of the request's own tokens that ends them, and what
    followed it there."""

    def __init__(self, start: int = 4, most: int = 16) -> None:
        self.start, self.most = start, most
        self._own: dict[Hashable, _Own] = {}

    def propose(self, key: Hashable, tokens: Sequence[int], namespace: Hashable, limit: int) -> list[int]:
        own = self._own.get(key)
        if own is None:
            own = self._own[key] = _Own(self.start, self.most)
        k = min(own.length.next(), limit)
        if k <= 0:
            return []
        own.index.update(tokens)
        n, at = own.index.lookup(tokens)
        best = list(tokens[at : at + k]) if n else []
        return self._better(best, n, tokens, namespace, k)

    def _better(
        self, draft: list[int], n: int, tokens: Sequence[int], namespace: Hashable, k: int
    ) -> list[int]:
        return draft

    def observe(self, key: Hashable, drafted: int, accepted: int) -> None:
        own = self._own.get(key)
        if own is not None:
            own.length.observe(drafted, accepted)

    def finish(self, key: Hashable, tokens: Sequence[int], namespace: Hashable) -> None:
        self._own.pop(key, None)


class History:
    """One tenant's recent sequences (prompts + outputs), concatenated with separators and indexed."""

    def __init__(self, budget: int = HISTORY_TOKENS) -> None:
        self.budget = budget
        self.tokens: list[int] = []
        self.index = NgramIndex(DEFAULT_NS)

    def add(self, seq: Sequence[int]) -> None:
        seq = list(seq[-(self.budget // 2) :])
        if len(self.tokens) + len(seq) + 1 > self.budget:  # keep the newer half: rebuilt now and then
            keep = self.tokens[len(self.tokens) - self.budget // 2 :]
            cut = keep.index(SEP) + 1 if SEP in keep else len(keep)
            self.tokens = keep[cut:]
            self.index.reset()
        self.tokens.extend(seq)
        self.tokens.append(SEP)
        self.index.update(self.tokens)

    def draft(self, query: Sequence[int], k: int) -> tuple[int, list[int]]:
        n, at = self.index.lookup(query)
        if not n:
            return 0, []
        out = self.tokens[at : at + k]
        return n, out[: out.index(SEP)] if SEP in out else out


class SuffixLookup(PromptLookup):
    """Prompt lookup plus the tenant's recent sequences: the longer match of the two drafts (the
    request's own on a tie)."""

    def __init__(self, start: int = 4, most: int = 16, budget: int = HISTORY_TOKENS) -> None:
        super().__init__(start, most)
        self.budget = budget
        self.histories: OrderedDict[Hashable, History] = OrderedDict()

    def _better(
        self, draft: list[int], n: int, tokens: Sequence[int], namespace: Hashable, k: int
    ) -> list[int]:
        hist = self.histories.get(namespace)
        if hist is None:
            return draft
        hn, hdraft = hist.draft(tokens, k)
        return hdraft if hn > n and hdraft else draft

    def finish(self, key: Hashable, tokens: Sequence[int], namespace: Hashable) -> None:
        super().finish(key, tokens, namespace)
        hist = self.histories.pop(namespace, None) or History(self.budget)
        self.histories[namespace] = hist  # most recently used last
        hist.add(tokens)
        while len(self.histories) > HISTORY_TENANTS:
            self.histories.popitem(last=False)


def make_drafter(mode: str) -> NoDrafts | PromptLookup:
    if mode == "off":
        return NoDrafts()
    if mode == "ngram":
        return PromptLookup()
    if mode == "suffix":
        return SuffixLookup()
    raise ValueError(f"speculative must be one of {', '.join(MODES)}, got {mode!r}")
