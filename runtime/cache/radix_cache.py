"""Radix tree of KV pages: which token prefixes already have their K/V computed, and where.

The algorithm is SGLang's radix cache; the handle API (``match`` / ``lock`` / ``insert`` /
``unlock``) follows mini-sglang.  The tree itself (nodes, whole-page keys, walks that split a node
where a match ends inside it, namespaces) is ``kvreuse.runtime.cache.radix_tree``; this module owns what the
tree's pages mean:

* ``insert(tokens, pages)`` needs ``len(tokens) == len(pages) * page_size``.  For the part of the
  key already in the tree the tree keeps *its* pages and the caller keeps ownership of the pages
  it passed for that part (it frees those that differ from the tree's; ids that came from a
  ``match`` are the tree's own and must not be freed).  The tree takes ownership of the pages of
  the new remainder.  ``prefix_len`` says how many tokens were already present.
* ``lock(handle)`` adds one reference to the node and every ancestor; a node with a non-zero
  ref count is never evicted.  So ref counts never increase going down, and the unlocked nodes
  form whole subtrees: ``evictable_pages`` is every page in a node with ref count 0.
* ``evict(n)`` frees unlocked leaves in the order of the tree's eviction policy (a strategy
  object from ``runtime/cache/eviction.py``; ``match`` and ``insert`` stamp the nodes on their path with
  a monotonic clock and report uses to it); a parent left childless and unlocked becomes a
  candidate in the same call.  A policy that trims (all but ``lru``) frees only the tail pages
  it needs from the last victim, splitting it, so the head of that prefix stays cached.
  Evictable leaves are tracked incrementally in a set, so one eviction costs a heap over the
  candidate leaves, never a walk of the whole tree.
* Namespaces (``runtime/cache/radix_tree.py``): ``match``/``insert`` take the request's ``CacheScope``
  (its namespace and how many leading tokens are public), so tenants never match each other's prefixes.
* ``events`` (``runtime/cache/events.py``) is told of every node inserted, every node evicted (before
  it is detached) and every reset: a gateway's index of what this cache holds is built from them.
* ``pin(handle)`` is a lock that is also counted in ``pinned_pages`` (the union of pinned paths,
  shared prefixes once); ``runtime/cache/pins.py`` gives pins owners, TTLs and a page budget.
* Per-node extra state (``states``: a ``kvreuse.runtime.cache.node_states.NodeStates``; a hybrid model's
  linear-attention snapshots): ``node.extra`` is the state after the prefix the node ends.
  ``insert(..., extra=[(n, state)])`` splits the path at ``n`` tokens and hangs the state there.
  With a state store a prefix is usable only where a state is: ``match`` / ``peek_len`` return the
  longest matched prefix whose last node holds one (or the root: the empty prefix, state zero);
  ``MatchResult.state`` is that state and ``cut_len`` the KV-matched tokens past it.  A window
  model's snapshots (``states.span``: W) splice: the match keeps all its KV, m tokens, where the last
  state at or above m (n1, or the root) and the nearest one below m in the tree (n2 <= n1 + W, on a
  continuation that diverged from this prompt) together hold the window before m
  (``SplicedSnapshot``): a rewrite before the first snapshot resumes at the rewrite's page.  A split
  leaves the state on the lower half; evicting a node drops its state; the store frees states
  (not pages) LRU within its own byte budget.  ``check()`` re-counts them.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from kvreuse.runtime.cache.events import CacheEvents
from kvreuse.runtime.cache.eviction import DEFAULT_POLICY, EvictionPolicy, make_policy
from kvreuse.runtime.cache.node_states import NodeState, NodeStates, NoNodeStates
from kvreuse.runtime.cache.page_allocator import PageAllocator
from kvreuse.runtime.cache.prefix_cache import InsertResult, MatchResult, NoTiers, PrefixCacheStats
from kvreuse.runtime.cache.radix_tree import RadixTree, TreeNode
from kvreuse.runtime.request import PUBLIC, CacheScope
from kvreuse.runtime.runner.window_pool import SplicedSnapshot

__all__ = ["InsertResult", "MatchResult", "RadixCache", "TreeNode"]


class RadixCache(NoTiers, RadixTree):
    """Prefix cache mapping page-aligned token prefixes to KV page ids (see module docstring).

    Implements ``kvreuse.runtime.cache.prefix_cache.PrefixCache``; handles are ``TreeNode`` objects.
    """

    def __init__(
        self,
        page_size: int,
        allocator: PageAllocator,
        policy: EvictionPolicy | str = DEFAULT_POLICY,
        states: NodeStates | NoNodeStates | None = None,
    ) -> None:
        super().__init__(page_size, make_policy(policy) if isinstance(policy, str) else policy)
        self.allocator = allocator
        # an ordered set: a policy that learns while it scores (``predict``) sees the leaves in an order
        # fixed by the tree's history, not by their addresses, so a replay gives the same figures twice
        self._evictable: dict[TreeNode, None] = {}
        self._total_pages = 0
        self._locked_pages = 0
        self._pinned_pages = 0
        self._num_pins = 0
        self.evicted_pages_total = 0
        # per-node extra state; with a store, matches end where a state is (a dense model's null store:
        # every page boundary resumes)
        self.states = states if states is not None else NoNodeStates()
        self.states.rank = lambda node: self.states.priority(self.policy, node, self._clock)
        self.events = CacheEvents()  # told of every node added and evicted (``runtime/cache/events.py``)

    @property
    def total_pages(self) -> int:
        return self._total_pages

    @property
    def locked_pages(self) -> int:
        return self._locked_pages

    @property
    def pinned_pages(self) -> int:
        return self._pinned_pages

    @property
    def evictable_pages(self) -> int:
        return self._total_pages - self._locked_pages

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(
            self._total_pages,
            self.evictable_pages,
            self.evicted_pages_total,
            self._pinned_pages,
            self._num_pins,
            len(self.states),
            self.states.nbytes,
        )

    def match(self, token_ids: Sequence[int], scope: CacheScope = PUBLIC) -> MatchResult:
        """Longest whole-page prefix of ``token_ids`` in the tree; splits the last node if needed.

        Only prefixes of ``scope.namespace`` match, except the first ``scope.public_len`` tokens,
        which match public ones (``runtime/request.py``).
        """
        node, pos, pages = self._walk(tuple(token_ids), scope, self._tick())
        kv_node, kv_len = node, pos
        while node is not self.root and not self.states.resumes_at(node, True):  # back to a state
            pos -= len(node.key)
            node = node.parent
        self.states.touch(node)
        span = self.states.span
        if span is not None and pos < kv_len:  # a window model: splice the window before kv_len
            top = self._snapshot_below(kv_node, kv_len, pos + span, {kv_node.ns, scope.namespace})
            if top is not None:
                self.states.touch(top[0])
                state = SplicedSnapshot(((pos, node.extra), (top[1], top[0].extra)))
                return MatchResult(kv_node, kv_len, pages[: kv_len // self.page_size], state=state)
        return MatchResult(node, pos, pages[: pos // self.page_size], state=node.extra, cut_len=kv_len - pos)

    def _snapshot_below(
        self, node: TreeNode, depth: int, limit: int, namespaces: set
    ) -> tuple[TreeNode, int] | None:
        """The nearest node below ``node`` (which ends at ``depth``) holding a state and ending at most at
        ``limit``, and where it ends; only through ``namespaces`` (a snapshot of another tenant's
        continuation holds the same keys below ``depth``, but whether it exists is theirs to know)."""
        best = None
        stack = [(c, depth + len(c.key)) for c in node.children.values() if c.ns in namespaces]
        while stack:
            child, end = stack.pop()
            if end > limit or (best is not None and end >= best[1]):
                continue
            if child.extra is not None:
                best = (child, end)
                continue
            stack.extend((c, end + len(c.key)) for c in child.children.values() if c.ns in namespaces)
        return best

    def peek_len(self, token_ids: Sequence[int], scope: CacheScope = PUBLIC) -> int:
        """``match(token_ids).cached_len`` without its side effects: no split, no access-time update.

        For scheduling estimates, which must not make a prefix look recently used.
        """
        tokens = tuple(token_ids)
        node: TreeNode | None = self.root
        pos = usable = 0
        while node is not None:
            node, n_pages = self._peek_step(node, tokens, pos, scope)
            if node is None:
                break
            pos += n_pages * self.page_size
            whole = n_pages == len(node.pages)
            if self.states.resumes_at(node, whole):
                usable = pos
            if not whole:
                break
        return usable

    def insert(
        self,
        token_ids: Sequence[int],
        pages: Sequence[int],
        scope: CacheScope = PUBLIC,
        extra: Sequence[tuple[int, NodeState]] = (),
    ) -> InsertResult:
        """Add ``token_ids`` (whole pages, held in ``pages``); see the module docstring for ownership.

        New nodes go to ``scope.namespace``, except those within the first ``scope.public_len`` tokens.
        ``extra``: ``(n, state)``, the state after ``token_ids[:n]`` (``n`` whole pages, ``0 < n <=
        len``), kept on the node ending there if the tree has a state store (a state already there
        is kept: the same prefix gives the same state).
        """
        tokens = tuple(token_ids)
        if len(tokens) != len(pages) * self.page_size:
            raise ValueError(
                f"insert needs whole pages: {len(tokens)} tokens for {len(pages)} pages of {self.page_size}"
            )
        now = self._tick()
        node, pos, held = self._walk(tokens, scope, now)
        prefix_len = pos
        while pos < len(tokens):  # one new leaf, or two where it crosses from public to private
            ns, end = self._scope_at(pos, len(tokens), scope)
            ps = self.page_size
            leaf = TreeNode(tokens[pos:end], list(pages[pos // ps : end // ps]), node, next(self._uids), ns)
            leaf.last_access = now
            self.policy.added(leaf, now)
            node.children[(ns, leaf.key[:ps])] = leaf
            self.num_nodes += 1
            self._total_pages += len(leaf.pages)
            self._refresh(node)
            self._refresh(leaf)
            self.events.stored(leaf)
            node, pos = leaf, end
        for n, state in extra:
            self._attach(tokens[:n], state, scope)
        return InsertResult(prefix_len, node, held + list(pages[prefix_len // self.page_size :]))

    def _attach(self, tokens: tuple[int, ...], state: NodeState, scope: CacheScope) -> None:
        assert len(tokens) % self.page_size == 0 and tokens
        node, pos, _ = self._walk(tokens, scope, None)  # insert stamped the path
        assert pos == len(tokens), "a state for a prefix the tree does not hold"
        if node.extra is None:
            self.states.attach(node, state)
        else:
            self.states.touch(node)

    def lock(self, handle: TreeNode) -> None:
        """Protect the handle's prefix from eviction (one more reference on it and its ancestors)."""
        self._add_ref(handle, 1, pin=False)

    def unlock(self, handle: TreeNode) -> None:
        """Drop one reference taken by :meth:`lock`."""
        self._add_ref(handle, -1, pin=False)

    def pin(self, handle: TreeNode) -> None:
        """A lock that also counts the path's pages in ``pinned_pages``; undone by :meth:`unpin`."""
        self._add_ref(handle, 1, pin=True)

    def unpin(self, handle: TreeNode) -> None:
        self._add_ref(handle, -1, pin=True)

    def evict(self, n_pages: int) -> int:
        """Free at least ``n_pages`` pages if possible, in policy order; returns pages freed.

        With a trimming policy exactly ``n_pages`` are freed when that many are evictable, unless the
        last victim holds a state (at its end: trimmed, it would resume nowhere), which goes whole.  With a state
        store, leaves no match can end at go first, whatever the policy says: no state at their end
        (never taken, or evicted from its budget), their pages only ever extend a KV match that is then
        cut back (a hybrid's or window model's tombstones).
        """
        policy, now, states = self.policy, self._clock, self.states
        key = lambda leaf: (states.resumes_at(leaf, True), states.priority(policy, leaf, now), leaf.uid)  # noqa: E731
        heap = [(*key(leaf), leaf) for leaf in self._evictable]
        heapq.heapify(heap)
        freed = 0
        while freed < n_pages and heap:
            *_, leaf = heapq.heappop(heap)
            if policy.spare(leaf):
                heapq.heappush(heap, (*key(leaf), leaf))
                continue
            want = n_pages - freed
            # a leaf's state sits at its end: trimmed, the rest could resume nowhere (a tombstone)
            if policy.trim and want < len(leaf.pages) and leaf.extra is None:
                self._split(leaf, len(leaf.pages) - want)  # ``leaf`` is now just its tail
            parent = leaf.parent
            assert parent is not None
            self._before_evict(leaf)
            self.events.removed(leaf)
            self.states.drop(leaf)
            del parent.children[(leaf.ns, leaf.key[: self.page_size])]
            self._evictable.pop(leaf, None)
            policy.removed(leaf)
            leaf.parent = None
            self.allocator.free(leaf.pages)
            freed += len(leaf.pages)
            self._total_pages -= len(leaf.pages)
            self.num_nodes -= 1
            self._refresh(parent)
            if parent in self._evictable:
                heapq.heappush(heap, (*key(parent), parent))
        self.evicted_pages_total += freed
        return freed

    def _before_evict(self, leaf: TreeNode) -> None:
        """Called with a leaf about to be evicted, still attached: a tiered cache copies it down here."""

    def reset(self) -> None:
        """Drop the whole tree and free its pages; only allowed while nothing is locked."""
        if self._locked_pages:
            raise RuntimeError(f"reset of a radix cache with {self._locked_pages} locked pages")
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            self.allocator.free(node.pages)
            self.policy.removed(node)
            node.parent = None
        self.root.children.clear()
        self.events.cleared()
        self.states.reset()
        self._evictable.clear()
        self._total_pages = 0
        self.num_nodes = 0

    def listen(self, events: CacheEvents) -> bool:
        """Tell ``events`` of every node stored and evicted and every reset from now on."""
        self.events = events
        return True

    def announce(self, events: CacheEvents) -> None:
        """Tell ``events`` every node held now, parents before their children, as stored."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            events.stored(node)
            stack.extend(node.children.values())

    def check(self) -> None:
        """Integrity of what the counters cannot show: every node state is the store's, bytes add up."""
        nodes, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node.extra is not None:
                nodes.append(node)
        self.states.check(nodes)

    def _add_ref(self, handle: TreeNode, delta: int, pin: bool) -> None:
        """Add ``delta`` references (pins when ``pin``) to ``handle`` and every ancestor."""
        self._check_attached(handle)
        if delta < 0 and handle is not self.root and (handle.pin if pin else handle.ref - handle.pin) <= 0:
            verb, state = ("unpin", "pinned") if pin else ("unlock", "locked")
            raise ValueError(f"{verb} of a node that is not {state}: {handle!r}")
        node: TreeNode | None = handle
        while node is not None and node is not self.root:
            n = len(node.pages)
            was_locked, was_pinned = node.ref > 0, node.pin > 0
            node.ref += delta
            if pin:
                node.pin += delta
                self._pinned_pages += n * ((node.pin > 0) - was_pinned)
            self._locked_pages += n * ((node.ref > 0) - was_locked)
            self._refresh(node)
            node = node.parent
        if pin:
            self._num_pins += delta

    def _refresh(self, node: TreeNode) -> None:
        """Re-derive whether ``node`` is an evictable leaf after its children or ref count changed."""
        if node is not self.root and node.ref == 0 and not node.children:
            self._evictable[node] = None
        else:
            self._evictable.pop(node, None)
