"""Extra state hanging off radix-tree nodes (a hybrid model's linear-attention snapshots), in a budget.

A node's state is the state *after* the prefix the node ends (root to the end of its key), so it
moves with the node's end: when the tree splits a node, the state stays on the lower half (whose
key still ends where the state was taken) and the new upper node has none.  When the tree evicts
a node its state goes with it (``dropped``); when the budget is short, the states of the nodes
ranked lowest (``rank``: the tree's eviction policy; least recently used among equals) are freed
first (``evicted``) and their nodes keep their KV pages.

The store knows nothing about what a state holds beyond ``nbytes``; the tree only asks it to
``attach`` / ``touch`` / ``drop`` and to ``check`` its accounting against the nodes it finds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol


class NodeState(Protocol):
    """What the store needs of a state: its size (``kvreuse.runtime.runner.state_pool.Snapshot`` is one)."""

    @property
    def nbytes(self) -> int: ...


class NodeStateStats(NamedTuple):
    """States held now, their bytes, the budget; totals since start: stored, evicted (budget), dropped
    (their node was evicted or reset)."""

    count: int
    bytes: int
    budget_bytes: int
    stored: int
    evicted: int
    dropped: int


class NodeStates:
    """The per-node states of one tree: ``node.extra`` holds the state, this store its order and bytes."""

    def __init__(self, budget_bytes: int, span: int | None = None) -> None:
        if budget_bytes < 0:
            raise ValueError(f"state budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        # a window model's snapshot at n holds the window layers' keys of positions [n - span, n): two of
        # them, at n1 <= m <= n2 with n2 - n1 <= span, hold the window before m (RadixCache.match splices
        # them).  None: a hybrid's recurrent state, usable only where it was taken.
        self.span = span
        self._lru: OrderedDict[Any, None] = OrderedDict()  # nodes holding a state, least recent first
        # which state goes first when the budget is short: the lowest rank, least recent among equals.
        # The radix cache ranks by its eviction policy, so pages and their states are judged alike
        # (LRU alone cycles: 8 conversations taking turns over 7 snapshots never found one,
        # benchmarks/traces/eviction_traces_window.py)
        self.rank: Callable[[Any], Any] = lambda node: 0
        self.nbytes = 0
        self._stored = self._evicted = self._dropped = 0

    def __len__(self) -> int:
        return len(self._lru)

    @staticmethod
    def priority(policy: Any, node: Any, now: int) -> Any:
        """The policy's order for a tree whose matches end only where a state is."""
        return policy.state_priority(node, now)

    def attach(self, node: Any, state: NodeState) -> bool:
        """Give ``node`` its state (it had none), freeing the lowest-ranked states for room; False if it
        cannot fit."""
        assert node.extra is None, "a node holds at most one state"
        if state.nbytes > self.budget_bytes:
            return False
        while self._lru and self.nbytes + state.nbytes > self.budget_bytes:
            self._free(min(self._lru, key=self.rank))
            self._evicted += 1
        node.extra = state
        self._lru[node] = None
        self.nbytes += state.nbytes
        self._stored += 1
        return True

    def resumes_at(self, node: Any, whole: bool) -> bool:
        """Whether a match may end at ``node`` (``whole``: all of its pages matched): only where a
        state is, since the state after a prefix cannot be rebuilt from its KV."""
        return whole and node.extra is not None

    def touch(self, node: Any) -> None:
        """A match resumed from ``node`` (its state, or the root's empty prefix): most recently used now."""
        if node.extra is not None:
            self._lru.move_to_end(node)

    def drop(self, node: Any) -> None:
        """``node`` leaves the tree: its state goes with it."""
        if node.extra is not None:
            self._free(node)
            self._dropped += 1

    def reset(self) -> None:
        for node in self._lru:
            node.extra = None
        self._lru.clear()
        self.nbytes = 0

    def stats(self) -> NodeStateStats:
        return NodeStateStats(
            len(self._lru), self.nbytes, self.budget_bytes, self._stored, self._evicted, self._dropped
        )

    def check(self, nodes_with_state: Iterable[Any]) -> None:
        """Integrity: the nodes of the tree that hold a state are exactly this store's, bytes add up,
        the budget holds."""
        found = list(nodes_with_state)
        if set(found) != set(self._lru) or len(found) != len(self._lru):
            raise AssertionError(
                f"node states: {len(found)} nodes hold one, the store counts {len(self._lru)}"
            )
        total = sum(n.extra.nbytes for n in found)
        if total != self.nbytes or total > self.budget_bytes:
            raise AssertionError(
                f"node state bytes: {total} held, {self.nbytes} counted, budget {self.budget_bytes}"
            )

    def _free(self, node: Any) -> None:
        del self._lru[node]
        self.nbytes -= node.extra.nbytes
        node.extra = None


class NoNodeStates:
    """The null store of a tree without states (a dense model, whose KV alone resumes a prefix):
    every page boundary is a resume point, and no node ever holds a state."""

    budget_bytes = nbytes = 0
    span = None
    rank: Callable[[Any], Any] = staticmethod(lambda node: 0)

    def __len__(self) -> int:
        return 0

    @staticmethod
    def priority(policy: Any, node: Any, now: int) -> Any:
        return policy.priority(node, now)

    def attach(self, node: Any, state: NodeState) -> bool:
        return False  # nothing is kept: a dense model offers no states

    def resumes_at(self, node: Any, whole: bool) -> bool:
        return True

    def touch(self, node: Any) -> None:
        pass

    def drop(self, node: Any) -> None:
        pass

    def reset(self) -> None:
        pass

    def stats(self) -> NodeStateStats:
        return NodeStateStats(0, 0, 0, 0, 0, 0)

    def check(self, nodes_with_state: Iterable[Any]) -> None:
        found = list(nodes_with_state)
        if found:
            raise AssertionError(f"node states: {len(found)} nodes hold one in a tree that keeps none")
