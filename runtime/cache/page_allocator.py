"""Free list of KV page ids.

The KV pool is an array of ``num_pages`` pages; this module only hands out and takes back their
integer ids.  Both directions are O(1) per page, and every id is checked so that a double free or
a foreign id fails loudly instead of silently letting two sequences share a page.
"""

from __future__ import annotations

from collections.abc import Iterable


class OutOfPages(Exception):
    """More pages were requested than are free; nothing was allocated."""

    def __init__(self, requested: int, available: int) -> None:
        super().__init__(f"requested {requested} KV pages but only {available} are free")
        self.requested = requested
        self.available = available


class PageAllocator:
    """Free list of KV page ids ``0 .. num_pages-1``."""

    def __init__(self, num_pages: int) -> None:
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        self.num_pages = num_pages
        # Reversed so that pops hand out low ids first: not required, but makes dumps readable.
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._is_free = bytearray(b"\x01") * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def is_free(self, page: int) -> bool:
        self._check_range(page)
        return bool(self._is_free[page])

    def alloc(self, n: int) -> list[int]:
        """Take ``n`` pages off the free list; raises :class:`OutOfPages` (allocating nothing) if short."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of pages ({n})")
        if n > len(self._free):
            raise OutOfPages(n, len(self._free))
        if n == 0:
            return []
        pages = self._free[-n:]
        del self._free[-n:]
        for p in pages:
            self._is_free[p] = 0
        pages.reverse()
        return pages

    def free(self, pages: Iterable[int]) -> None:
        """Return pages to the free list; the whole call is rejected if any id is invalid or already free."""
        pages = list(pages)
        for p in pages:
            self._check_range(p)
            if self._is_free[p]:
                raise ValueError(f"double free of KV page {p}")
        if len(set(pages)) != len(pages):
            raise ValueError("the same KV page is freed twice in one call")
        for p in pages:
            self._is_free[p] = 1
        self._free.extend(pages)

    def _check_range(self, page: int) -> None:
        if not 0 <= page < self.num_pages:
            raise ValueError(f"KV page id {page} out of range [0, {self.num_pages})")
