"""The radix tree with host and disk tiers below it: pages evicted from the pool are kept, not lost.

The tree holds what is in the pool.  Below it, :class:`kvreuse.runtime.cache.store.tiers.LowerTiers` holds
pages keyed by their prefix chain (:mod:`kvreuse.runtime.cache.store.page_keys`), so its index is a tree too
and continues the radix tree past its leaves::

    tokens : | p0 | p1 | p2 | p3 | p4 | p5 |
    pool   : [ tree   tree ]                     match in the radix tree: 2 pages
    host   :             [ p2 ]                  then the chain continues in host memory
    disk   :                  [ p3   p4 ]        and on disk; p5 was never computed
    result : 5 pages, 3 of them loaded into pool pages allocated now and inserted into the tree

* ``match`` loads the lower-tier part of a prefix into fresh pool pages (evicting, i.e. demoting,
  other leaves if the free list is short), inserts them into the tree, and returns the whole
  prefix, so callers only ever see pool pages; ``MatchResult.host_len`` / ``disk_len`` say how many
  of the matched tokens came from each tier.
* Eviction demotes: the leaf's K/V are copied out before its pages are freed and handed to the
  tiers (host memory first when there is a host tier, its overflow to disk; else straight to disk,
  written on a background thread).  With ``write_through`` every insert is also written down at
  once, so a crash loses nothing that was computed.
* With a shared tier (a Valkey server several replicas use) every insert is written through to it
  in the background, and a match continues there past host and disk (``MatchResult.shared_len``).
* ``persist`` writes every page still only in the pool down (shutdown, and periodically), so a
  server started on the same store finds the whole tree again.
* A window model's tree keeps states on its nodes (window snapshots, ``runtime/cache/node_states.py``):
  a node's state goes down to ``state_tier`` (keyed by the page key its prefix ends with) when the node
  is evicted or persisted, and a match through the tiers stops at the last page a stored state ends,
  whose state comes back with the pages (without one, those pages could only be recomputed)::

    tree   : [ p0 p1 ]*                    * a state on the node ending there
    tiers  :          [ p2 p3 p4 ]          pages below, with a state stored at the end of p3
    result : 4 pages (p2, p3 loaded) and the state after p3 attached to the node inserted for them
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from typing import Protocol

import torch

from kvreuse.runtime.cache.eviction import DEFAULT_POLICY
from kvreuse.runtime.cache.node_states import NodeStates, NoNodeStates
from kvreuse.runtime.cache.page_allocator import PageAllocator
from kvreuse.runtime.cache.prefix_cache import MatchResult
from kvreuse.runtime.cache.radix_cache import RadixCache, TreeNode
from kvreuse.runtime.cache.store.page_keys import page_keys, root_key, scope_namespaces
from kvreuse.runtime.cache.store.states import StateTier
from kvreuse.runtime.cache.store.tiers import LowerTiers
from kvreuse.runtime.request import PUBLIC, CacheScope


class PageIO(Protocol):
    """Copies whole pages' K/V between the pool and host tensors ``[n, layers, 2, page, heads, dim]``."""

    def read_pages(self, pages: Sequence[int]) -> torch.Tensor: ...

    def write_pages(self, pages: Sequence[int], kv: torch.Tensor) -> None: ...


class TieredRadixCache(RadixCache):
    """A :class:`RadixCache` whose evictions go to lower tiers and whose matches come back from them."""

    def __init__(
        self,
        page_size: int,
        allocator: PageAllocator,
        io: PageIO,
        tiers: LowerTiers,
        write_through: bool = False,
        policy: str = DEFAULT_POLICY,
        states: NodeStates | NoNodeStates | None = None,
        state_tier: StateTier | None = None,
    ) -> None:
        """``states``/``state_tier``: a window model's node states and where they go below the pool
        (both or neither)."""
        super().__init__(page_size, allocator, policy, states)
        self.io = io
        self.tiers = tiers
        self.write_through = write_through
        self.root_key = root_key()
        self.state_tier = state_tier

    # -- reads --------------------------------------------------------------------------
    def _keys(self, tokens: list[int], scope: CacheScope) -> list[bytes]:
        n_pages = len(tokens) // self.page_size
        ns = scope_namespaces(n_pages, self.page_size, scope.namespace, scope.public_len)
        return page_keys(tokens[: n_pages * self.page_size], self.page_size, self.root_key, namespaces=ns)

    def match(self, token_ids: Sequence[int], scope: CacheScope = PUBLIC) -> MatchResult:
        m = super().match(token_ids, scope)
        tokens = list(token_ids)
        n_pages = len(tokens) // self.page_size
        first = (m.cached_len + m.cut_len) // self.page_size  # the tree's pages, past its last state too
        if first == n_pages:
            return m
        keys = self._keys(tokens, scope)
        tm = self.tiers.match(keys[first:])
        if tm.total == 0:
            return m
        node, _, tree_pages = self._walk(tuple(tokens[: first * self.page_size]), scope, None)
        self.lock(node)  # the matched prefix must survive the evictions that make room below
        try:
            n = self._room_for(tm.total)
            extra, n = self._stored_state(keys, first, n)
            if n == 0:
                return m
            tm = tm.first(n)
            kv = self.tiers.load(keys[first : first + n], tm)
            if kv is None:  # a disk group failed its checksum: those tokens are recomputed
                return m
            n = kv.shape[0]  # a shared entry evicted or refused since the match ends the prefix there
            tm = tm.first(n)
            pages = self.allocator.alloc(n)
            self.io.write_pages(pages, kv)
            end = (first + n) * self.page_size
            extra = [
                (at, st) for at, st in extra if at <= end
            ]  # a state past a cut-short load is not reached
            res = super().insert(tokens[:end], tree_pages + pages, scope, extra)
            assert res.prefix_len == first * self.page_size, "the tree changed between match and load"
        finally:
            self.unlock(node)
        full = super().match(tokens[:end], scope)
        ps = self.page_size
        return full._replace(host_len=tm.host * ps, disk_len=tm.disk * ps, shared_len=tm.shared * ps)

    def _stored_state(self, keys: list[bytes], first: int, n: int) -> tuple[list[tuple[int, object]], int]:
        """Where a tier match of ``n`` pages after ``first`` may end, and the state to attach there:
        anywhere for a dense model; for a window model at the last page a stored state ends (0: none)."""
        if self.state_tier is None:
            return [], n
        for last in range(first + n, first, -1):
            if keys[last - 1] in self.state_tier and (st := self.state_tier.get(keys[last - 1])) is not None:
                return [(last * self.page_size, st)], last - first
        return [], 0

    def prefetch(self, token_ids: Sequence[int], scope: CacheScope = PUBLIC) -> Future | None:
        """Start reading the lower-tier part of this prefix from disk in the background (a Future or None)."""
        tokens = list(token_ids)
        n_pages = len(tokens) // self.page_size
        first = self.peek_len(tokens, scope) // self.page_size
        if first == n_pages:
            return None
        return self.tiers.prefetch(self._keys(tokens, scope)[first:])

    def reset(self) -> None:
        """Drop the tree and what the tiers below it hold: a reset cache serves nothing (the naive
        baseline of a benchmark resets between requests, so a tier must not answer for the pool)."""
        super().reset()
        self.tiers.clear()
        if self.state_tier is not None:
            self.state_tier.clear()

    def _room_for(self, n: int) -> int:
        short = n - self.allocator.num_free
        if short > 0:
            self.evict(short)
        return min(n, self.allocator.num_free)

    # -- writes -------------------------------------------------------------------------
    def insert(
        self,
        token_ids: Sequence[int],
        pages: Sequence[int],
        scope: CacheScope = PUBLIC,
        extra: Sequence[tuple[int, object]] = (),
    ):
        res = super().insert(token_ids, pages, scope, extra)
        if self.write_through and res.prefix_len < len(token_ids):
            self._write_down(res.handle)
        if self.tiers.shared is not None and res.prefix_len < len(token_ids):
            self._share(res.handle)
        return res

    def _share(self, node: TreeNode) -> int:
        """Write the pages of the path ending at ``node`` that the shared tier lacks through to it
        (a replica may die any time: what another must find is what it has computed, not what it
        evicted).  Known-stored pages are skipped without asking the server."""
        if not self.tiers.shared.accepts():
            return 0
        path = self.path_tokens(node)
        keys = page_keys(path, self.page_size, self.root_key, namespaces=self.path_namespaces(node))
        first = self.tiers.shared.known(keys)
        if first >= len(keys):
            return 0
        ps = self.page_size
        toks = [tuple(path[i * ps : (i + 1) * ps]) for i in range(first, len(keys))]
        kv = self.io.read_pages(self.path_pages(node)[first:])
        self.tiers.share(keys[first - 1] if first else self.root_key, first == 0, keys[first:], toks, kv)
        return len(keys) - first

    def _before_evict(self, leaf: TreeNode) -> None:
        self._write_down(leaf)
        self._write_state(leaf)

    def _write_state(self, node: TreeNode, durable: bool = False) -> None:
        """Copy ``node``'s state (a window snapshot) down beside its pages, keyed by its last page's key."""
        if self.state_tier is None or node.extra is None:
            return
        path = self.path_tokens(node)
        keys = page_keys(path, self.page_size, self.root_key, namespaces=self.path_namespaces(node))
        self.state_tier.put(keys[-1], node.extra, durable)

    def _write_down(self, node: TreeNode, durable: bool = False) -> int:
        """Copy the pages of the path ending at ``node`` that no lower tier has yet down to the tiers.

        The whole path, not only ``node``'s pages: a stored page names its parent, and one whose
        parent is stored nowhere could never be matched after a restart.  The pages are copied
        out now, since the pool reuses them right after an eviction.  ``durable``: to disk, past
        the host tier (persistence).
        """
        if not self.tiers.accepts(durable):  # a failed disk tier: nothing to copy the pages out for
            return 0
        path, path_pages = self.path_tokens(node), self.path_pages(node)
        keys = page_keys(path, self.page_size, self.root_key, namespaces=self.path_namespaces(node))
        first = self.tiers.match(keys, durable, shared=False).total
        if first >= len(keys):
            return 0
        ps = self.page_size
        toks = [tuple(path[i * ps : (i + 1) * ps]) for i in range(first, len(keys))]
        parent = keys[first - 1] if first else self.root_key
        kv = self.io.read_pages(path_pages[first:])
        self.tiers.write_back(parent, first == 0, keys[first:], toks, kv, durable)
        return len(keys) - first

    def persist(self, wait: bool = True) -> int:
        """Write every tree page that is not on disk yet down to disk; returns pages queued.

        Leaves only: writing a leaf's path covers its ancestors.  ``wait``: until the writes are on
        disk (shutdown); a periodic sync only queues them for the writer thread.
        """
        written = 0
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            self._write_state(node, durable=True)
            if node.children:
                stack.extend(node.children.values())
            else:
                written += self._write_down(node, durable=True)
        if wait:
            self.tiers.flush()
        return written

    def load_stored(self) -> int:
        """Bring stored prefixes from disk into the pool while free pages last; returns tokens loaded.

        Longest chains first; stops before a chain would need evictions (which would only demote
        what was just loaded).
        """
        if self.tiers.disk is None:
            return 0
        loaded = 0
        for tokens in self.tiers.disk.chains(self.root_key):
            need = (len(tokens) - self.peek_len(tokens)) // self.page_size
            if need > self.allocator.num_free:
                continue
            m = self.match(tokens)
            loaded += m.host_len + m.disk_len
        return loaded

    def path_namespaces(self, node: TreeNode) -> list[Hashable]:
        """The namespace of each page of the prefix that ends at ``node``."""
        parts = []
        while node is not None and node is not self.root:
            parts.append([node.ns] * len(node.pages))
            node = node.parent
        return [ns for part in reversed(parts) for ns in part]

    def path_pages(self, node: TreeNode) -> list[int]:
        """The pool pages of the whole prefix that ends at ``node``."""
        parts = []
        while node is not None and node is not self.root:
            parts.append(node.pages)
            node = node.parent
        return [p for part in reversed(parts) for p in part]

    def path_tokens(self, node: TreeNode) -> list[int]:
        """The whole token prefix that ends at ``node``."""
        parts = []
        while node is not None and node is not self.root:
            parts.append(node.key)
            node = node.parent
        return [t for part in reversed(parts) for t in part]
