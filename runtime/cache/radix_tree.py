"""The structure under the prefix cache: a radix tree of whole KV pages keyed by token prefixes.

``kvreuse.runtime.cache.radix_cache.RadixCache`` builds on it (ownership, locks and pins, eviction, per-node
states); this module is only nodes, walks and splits.  Everything is counted in whole pages of
``page_size`` tokens:

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
* Namespaces (tenants, ``runtime/request.py``): a node belongs to one; children are keyed by
  ``(namespace, first page)``, and a walk takes the request's ``CacheScope`` (its namespace and how
  many leading tokens are public, namespace ``None``), so tenants never match each other's prefixes.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable

from kvreuse.runtime.cache.eviction import EvictionPolicy
from kvreuse.runtime.cache.tree_node import TreeNode
from kvreuse.runtime.request import CacheScope


class RadixTree:
    """Nodes, walks and splits of the page radix tree (see the module docstring); the eviction
    policy is told of every use and split, since its order is kept per node."""

    def __init__(self, page_size: int, policy: EvictionPolicy) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.policy = policy
        self._uids = itertools.count()
        self.root = TreeNode((), [], None, next(self._uids))
        self._clock = 0
        self.num_nodes = 0

    def handle_len(self, handle: TreeNode) -> int:
        """Tokens of the prefix that ``handle`` ends."""
        n, node = 0, handle
        while node is not None:
            n += len(node.key)
            node = node.parent
        return n

    def finished(self, handle: TreeNode, num_prompt: int, num_output: int) -> None:
        """A request whose cached prefix ends at ``handle`` ended (its lengths are a hint for the policy)."""
        self.policy.finished(handle, num_prompt, num_output)

    def _walk(
        self, tokens: tuple[int, ...], scope: CacheScope, now: int | None
    ) -> tuple[TreeNode, int, list[int]]:
        """Follow (splitting) the longest whole-page path of ``tokens``: its last node, length, pages.

        Stamps the path as used at ``now`` (None: a walk that is bookkeeping, not a use)."""
        node, pos, pages = self.root, 0, []
        while pos < len(tokens):
            child, n_pages = self._step(node, tokens, pos, scope)
            if child is None:
                break
            if now is not None:
                self._touch(child, now)
            pages.extend(child.pages)
            pos += n_pages * self.page_size
            node = child
        return node, pos, pages

    def _touch(self, node: TreeNode, now: int) -> None:
        """Stamp a node on a match/insert path; reaching one nobody holds is a use for the policy."""
        node.last_access = now
        if node.ref == 0:
            self.policy.used(node, now)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _scope_at(self, pos: int, end: int, scope: CacheScope) -> tuple[Hashable, int]:
        """The namespace of the tokens at ``pos`` and where that namespace stops (at most ``end``)."""
        boundary = scope.public_len // self.page_size * self.page_size
        if scope.namespace is not None and pos < boundary:
            return None, min(end, boundary)
        return scope.namespace, end

    def _step(
        self, node: TreeNode, tokens: tuple[int, ...], pos: int, scope: CacheScope
    ) -> tuple[TreeNode | None, int]:
        """Follow the child of ``node`` matching ``tokens[pos:]``; returns it and its matched pages.

        When the match ends inside the child, the child is split so that the returned node is
        exactly the matched part.
        """
        child, n = self._peek_step(node, tokens, pos, scope)
        if child is not None and n < len(child.pages):
            child = self._split(child, n)
        return child, n

    def _peek_step(
        self, node: TreeNode, tokens: tuple[int, ...], pos: int, scope: CacheScope
    ) -> tuple[TreeNode | None, int]:
        """The child of ``node`` matching ``tokens[pos:]`` and how many of its pages match."""
        ps = self.page_size
        ns, end = self._scope_at(pos, len(tokens), scope)
        child = node.children.get((ns, tokens[pos : pos + ps])) if pos + ps <= end else None
        if child is None:
            return None, 0
        n = 1
        limit = min(len(child.pages), (end - pos) // ps)
        while n < limit and child.key[n * ps : (n + 1) * ps] == tokens[pos + n * ps : pos + (n + 1) * ps]:
            n += 1
        return child, n

    def _split(self, node: TreeNode, n_pages: int) -> TreeNode:
        """Cut ``node`` after ``n_pages`` pages; returns the new upper node, ``node`` keeps the rest."""
        cut = n_pages * self.page_size
        parent = node.parent
        assert parent is not None
        upper = TreeNode(node.key[:cut], node.pages[:n_pages], parent, next(self._uids), node.ns)
        upper.ref, upper.pin = node.ref, node.pin
        upper.last_access = node.last_access
        parent.children[(upper.ns, upper.key[: self.page_size])] = upper
        node.key = node.key[cut:]
        node.pages = node.pages[n_pages:]
        node.parent = upper
        upper.children[(node.ns, node.key[: self.page_size])] = node
        self.num_nodes += 1
        self.policy.split(upper, node)
        return upper

    def _check_attached(self, handle: TreeNode) -> None:
        if handle is not self.root and handle.parent is None:
            raise ValueError(f"handle {handle!r} is no longer in the tree (evicted or reset)")
