"""The host tier: KV pages in (pinned, on a GPU machine) host memory, LRU under a byte budget.

Same keys and the same questions as the disk tier (:class:`kvreuse.runtime.cache.store.disk.DiskStore`):
``match`` how many leading pages are here, ``get`` them, ``put`` consecutive pages.  Pages it
evicts are handed to ``on_evict`` (the disk tier's write-back) with their parent key, so a
page leaves host memory for disk rather than disappearing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch


class HostPage(NamedTuple):
    """One page in host memory."""

    parent: bytes
    parent_is_root: bool
    tokens: tuple[int, ...]
    kv: torch.Tensor


EvictFn = Callable[[bytes, bool, list[bytes], list[tuple[int, ...]], torch.Tensor], None]


class HostStore:
    """An LRU dict of pages keyed by :mod:`kvreuse.runtime.cache.store.page_keys` keys."""

    def __init__(self, budget_bytes: int, pin: bool = False, on_evict: EvictFn | None = None) -> None:
        self.budget = int(budget_bytes)
        self.pin = pin
        self.on_evict = on_evict
        self._pages: OrderedDict[bytes, HostPage] = OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._pages)

    def clear(self) -> None:
        """Forget every page (no eviction callback: they are not written anywhere)."""
        self._pages.clear()
        self.nbytes = 0

    def __contains__(self, key: bytes) -> bool:
        return key in self._pages

    def match(self, keys: Sequence[bytes]) -> int:
        n = 0
        for k in keys:
            if k not in self._pages:
                break
            self._pages.move_to_end(k)
            n += 1
        return n

    def get(self, keys: Sequence[bytes]) -> torch.Tensor | None:
        if any(k not in self._pages for k in keys):
            return None
        for k in keys:
            self._pages.move_to_end(k)
        return torch.stack([self._pages[k].kv for k in keys])

    def put(
        self,
        parent: bytes,
        parent_is_root: bool,
        keys: Sequence[bytes],
        tokens: Sequence[Sequence[int]],
        kv: torch.Tensor,
    ) -> int:
        """Keep consecutive pages; returns how many were new."""
        new = 0
        prev, prev_root = parent, parent_is_root
        for i, k in enumerate(keys):
            if k in self._pages:
                self._pages.move_to_end(k)
            else:
                page = kv[i].detach().to("cpu").clone()
                if self.pin:
                    page = page.pin_memory()
                self._pages[k] = HostPage(prev, prev_root, tuple(tokens[i]), page)
                self.nbytes += page.numel() * page.element_size()
                new += 1
            prev, prev_root = k, False
        self._evict_to(self.budget)
        return new

    def check(self) -> None:
        """Byte count equals the pages held, and within budget; raises AssertionError otherwise."""
        held = sum(p.kv.numel() * p.kv.element_size() for p in self._pages.values())
        if held != self.nbytes or self.nbytes > self.budget:
            raise AssertionError(f"host tier: {held} bytes held, {self.nbytes} counted, budget {self.budget}")

    def drain(self) -> None:
        """Hand every page to ``on_evict`` (a shutdown flush), oldest first."""
        self._evict_to(0)

    def _evict_to(self, budget: int) -> None:
        while self.nbytes > budget and self._pages:
            key, page = self._pages.popitem(last=False)
            self.nbytes -= page.kv.numel() * page.kv.element_size()
            if self.on_evict is not None:
                self.on_evict(page.parent, page.parent_is_root, [key], [page.tokens], page.kv.unsqueeze(0))
