"""Radix tree of KV pages: which token prefixes already have their K/V computed, and where.

The algorithm is SGLang's radix cache; the handle API (``match`` / ``lock`` / ``insert`` /
``unlock``) follows mini-sglang.  Everything is counted in whole pages of ``page_size`` tokens:

    tokens : t0 t1 t2 t3 | t4 t5 t6 t7 | t8 t9 t10 t11 | t12 t13     (page_size = 4)
    pages  :    p17      |    p3       |     p42        | (partial: never cached)

* A node's ``key`` is a run of tokens whose length is a multiple of ``page_size``; its ``pages``
  hold exactly ``len(key) // page_size`` page ids, page ``i`` holding key tokens
  ``[i*page_size, (i+1)*page_size)``.  Children are keyed by their first page of tokens, so two
  children of one node never share a first page.  The root holds no tokens and no pages.
* ``match(tokens)`` follows the longest path of whole pages (37 tokens with page_size 16 match at
  most 32).  If it ends inside a node, that node is split at the page boundary so the returned
  handle covers exactly the matched prefix::

        before:  root -- [A B | C D | E F] (p1 p2 p3)        match([A B C D X Y]), page_size 2
        after :  root -- [A B | C D] (p1 p2) -- [E F] (p3)   handle = the new upper node

  A split node's ref count and last-access time are copied to the new upper node, so locks
  taken on the old node (whose handle stays valid: it is the lower half) still cover the path.
* ``insert(tokens, pages)`` needs ``len(tokens) == len(pages) * page_size``.  For the part of the
  key already in the tree the tree keeps *its* pages and the caller keeps ownership of the pages
  it passed for that part (it frees those that differ from the tree's; ids that came from a
  ``match`` are the tree's own and must not be freed).  The tree takes ownership of the pages of
  the new remainder.  ``prefix_len`` says how many tokens were already present.
* ``lock(handle)`` adds one reference to the node and every ancestor; a node with a non-zero
  ref count is never evicted.  So ref counts never increase going down, and the unlocked nodes
  form whole subtrees: ``evictable_pages`` is every page in a node with ref count 0.
* ``evict(n)`` frees unlocked leaves, least recently used first (``match`` and ``insert`` stamp
  the nodes on their path with a monotonic clock); a parent left childless and unlocked becomes
  a candidate in the same call.  Evictable leaves are tracked incrementally in a set, so one
  eviction costs a heap over the candidate leaves, never a walk of the whole tree.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

from runtime.page_allocator import PageAllocator
from runtime.prefix_cache import InsertResult, MatchResult, PrefixCacheStats


class TreeNode:
    """One edge of the radix tree: a run of whole pages and the tokens they hold."""

    __slots__ = ("key", "pages", "children", "parent", "ref", "last_access", "uid")

    def __init__(self, key: tuple[int, ...], pages: list[int], parent: TreeNode | None, uid: int) -> None:
        self.key = key
        self.pages = pages
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.parent = parent
        self.ref = 0
        self.last_access = 0
        self.uid = uid

    def __repr__(self) -> str:
        return f"TreeNode(uid={self.uid}, tokens={len(self.key)}, pages={self.pages}, ref={self.ref})"


class RadixCache:
    """Prefix cache mapping page-aligned token prefixes to KV page ids (see module docstring).

    Implements ``runtime.prefix_cache.PrefixCache``; handles are ``TreeNode`` objects.
    """

    def __init__(self, page_size: int, allocator: PageAllocator) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.allocator = allocator
        self._uids = itertools.count()
        self.root = TreeNode((), [], None, next(self._uids))
        self._clock = 0
        self._evictable: set[TreeNode] = set()
        self._total_pages = 0
        self._locked_pages = 0
        self.num_nodes = 0
        self.evicted_pages_total = 0

    @property
    def total_pages(self) -> int:
        return self._total_pages

    @property
    def locked_pages(self) -> int:
        return self._locked_pages

    @property
    def evictable_pages(self) -> int:
        return self._total_pages - self._locked_pages

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(self._total_pages, self.evictable_pages, self.evicted_pages_total)

    def match(self, token_ids: Sequence[int]) -> MatchResult:
        """Longest whole-page prefix of ``token_ids`` in the tree; splits the last node if needed."""
        tokens = tuple(token_ids)
        now = self._tick()
        node, pos, pages = self.root, 0, []
        while True:
            child, n_pages = self._step(node, tokens, pos)
            if child is None:
                break
            child.last_access = now
            pages.extend(child.pages)
            pos += n_pages * self.page_size
            node = child
        return MatchResult(node, pos, pages)

    def peek_len(self, token_ids: Sequence[int]) -> int:
        """``match(token_ids).cached_len`` without its side effects: no split, no access-time update.

        For scheduling estimates, which must not make a prefix look recently used.
        """
        tokens = tuple(token_ids)
        node: TreeNode | None = self.root
        pos = 0
        while node is not None:
            node, n_pages = self._peek_step(node, tokens, pos)
            pos += n_pages * self.page_size
            if node is not None and n_pages < len(node.pages):
                break
        return pos

    def insert(self, token_ids: Sequence[int], pages: Sequence[int]) -> InsertResult:
        """Add ``token_ids`` (whole pages, held in ``pages``); see the module docstring for ownership."""
        tokens = tuple(token_ids)
        if len(tokens) != len(pages) * self.page_size:
            raise ValueError(
                f"insert needs whole pages: {len(tokens)} tokens for {len(pages)} pages of {self.page_size}"
            )
        now = self._tick()
        node, pos = self.root, 0
        while pos < len(tokens):
            child, n_pages = self._step(node, tokens, pos)
            if child is None:
                break
            child.last_access = now
            pos += n_pages * self.page_size
            node = child
        prefix_len = pos
        if pos < len(tokens):
            leaf = TreeNode(tokens[pos:], list(pages[pos // self.page_size :]), node, next(self._uids))
            leaf.last_access = now
            node.children[leaf.key[: self.page_size]] = leaf
            self.num_nodes += 1
            self._total_pages += len(leaf.pages)
            self._refresh(node)
            self._refresh(leaf)
            node = leaf
        return InsertResult(prefix_len, node)

    def lock(self, handle: TreeNode) -> None:
        """Protect the handle's prefix from eviction (one more reference on it and its ancestors)."""
        self._check_attached(handle)
        node: TreeNode | None = handle
        while node is not None and node is not self.root:
            if node.ref == 0:
                self._locked_pages += len(node.pages)
            node.ref += 1
            self._refresh(node)
            node = node.parent

    def unlock(self, handle: TreeNode) -> None:
        """Drop one reference taken by :meth:`lock`."""
        self._check_attached(handle)
        if handle is not self.root and handle.ref <= 0:
            raise ValueError(f"unlock of a node that is not locked: {handle!r}")
        node: TreeNode | None = handle
        while node is not None and node is not self.root:
            node.ref -= 1
            if node.ref == 0:
                self._locked_pages -= len(node.pages)
            self._refresh(node)
            node = node.parent

    def evict(self, n_pages: int) -> int:
        """Free at least ``n_pages`` pages if possible, LRU unlocked leaves first; returns pages freed."""
        heap = [(leaf.last_access, leaf.uid, leaf) for leaf in self._evictable]
        heapq.heapify(heap)
        freed = 0
        while freed < n_pages and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[: self.page_size]]
            self._evictable.discard(leaf)
            leaf.parent = None
            self.allocator.free(leaf.pages)
            freed += len(leaf.pages)
            self._total_pages -= len(leaf.pages)
            self.num_nodes -= 1
            self._refresh(parent)
            if parent in self._evictable:
                heapq.heappush(heap, (parent.last_access, parent.uid, parent))
        self.evicted_pages_total += freed
        return freed

    def reset(self) -> None:
        """Drop the whole tree and free its pages; only allowed while nothing is locked."""
        if self._locked_pages:
            raise RuntimeError(f"reset of a radix cache with {self._locked_pages} locked pages")
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            self.allocator.free(node.pages)
            node.parent = None
        self.root.children.clear()
        self._evictable.clear()
        self._total_pages = 0
        self.num_nodes = 0

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _step(self, node: TreeNode, tokens: tuple[int, ...], pos: int) -> tuple[TreeNode | None, int]:
        """Follow the child of ``node`` matching ``tokens[pos:]``; returns it and its matched pages.

        When the match ends inside the child, the child is split so that the returned node is
        exactly the matched part.
        """
        child, n = self._peek_step(node, tokens, pos)
        if child is not None and n < len(child.pages):
            child = self._split(child, n)
        return child, n

    def _peek_step(self, node: TreeNode, tokens: tuple[int, ...], pos: int) -> tuple[TreeNode | None, int]:
        """The child of ``node`` matching ``tokens[pos:]`` and how many of its pages match."""
        ps = self.page_size
        child = node.children.get(tokens[pos : pos + ps]) if pos + ps <= len(tokens) else None
        if child is None:
            return None, 0
        n = 1
        limit = min(len(child.pages), (len(tokens) - pos) // ps)
        while n < limit and child.key[n * ps : (n + 1) * ps] == tokens[pos + n * ps : pos + (n + 1) * ps]:
            n += 1
        return child, n

    def _split(self, node: TreeNode, n_pages: int) -> TreeNode:
        """Cut ``node`` after ``n_pages`` pages; returns the new upper node, ``node`` keeps the rest."""
        cut = n_pages * self.page_size
        parent = node.parent
        assert parent is not None
        upper = TreeNode(node.key[:cut], node.pages[:n_pages], parent, next(self._uids))
        upper.ref = node.ref
        upper.last_access = node.last_access
        parent.children[upper.key[: self.page_size]] = upper
        node.key = node.key[cut:]
        node.pages = node.pages[n_pages:]
        node.parent = upper
        upper.children[node.key[: self.page_size]] = node
        self.num_nodes += 1
        return upper

    def _refresh(self, node: TreeNode) -> None:
        """Re-derive whether ``node`` is an evictable leaf after its children or ref count changed."""
        if node is not self.root and node.ref == 0 and not node.children:
            self._evictable.add(node)
        else:
            self._evictable.discard(node)

    def _check_attached(self, handle: TreeNode) -> None:
        if handle is not self.root and handle.parent is None:
            raise ValueError(f"handle {handle!r} is no longer in the tree (evicted or reset)")
