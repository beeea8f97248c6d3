"""The ``hazard`` eviction policies (``runtime/cache/eviction.py`` lists every policy and registers these):
evict the node least likely to be used again before the cache turns over, by classes of nodes that
each learn online how many of theirs come back and after how long (``return_stats.ReturnStats``).

``answer`` splits the never-used classes by the length of the answer that the request which wrote
the node gave (``finished``; log2 buckets of output tokens).  On the Mooncake trace that is the
strongest sign of a prefix that returns: a long document asked a short question comes back with
the next question, a chat turn with a long answer mostly does not.  Each bucket learns its own
share, and ranks by the coarse class until ``MIN_ENTRIES`` of its pages have entered, so a
workload where the answer's length says nothing gets ``hazard``'s order.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from kvreuse.runtime.cache.policy_base import PerNode
from kvreuse.runtime.cache.return_stats import ReturnStats

if TYPE_CHECKING:
    from kvreuse.runtime.cache.tree_node import TreeNode

TURNOVER_EWMA = 0.05  # weight of the latest victim's idle time in the turnover estimate
ANSWER_BUCKETS = 12  # log2 buckets of a request's output tokens (4096 and more share the last)
MIN_ENTRIES = 64  # pages a fine class must have seen enter before it ranks on its own


class ReturnHazard(PerNode):
    """Evict the node least likely to be back before the cache turns over (see the module docstring)."""

    name = "hazard"

    def __init__(self, ghost_size: int = 1 << 16) -> None:
        super().__init__()
        self.classes: dict[tuple, ReturnStats] = {}
        # first page's hash -> (class, last use, uses, pages)
        self.ghost: OrderedDict[int, tuple] = OrderedDict()
        self.ghost_size = ghost_size
        self.turnover = 0.0  # mean idle time of evicted nodes, in ticks
        self.now = 0

    def _class(self, cls: tuple) -> ReturnStats:
        return self.classes.setdefault(cls, ReturnStats())

    def _back(self, cls: tuple, gap: int, pages: int) -> None:
        self._class(cls).back(gap, pages)

    def _stats(self, cls: tuple) -> ReturnStats:
        """The statistics a node of class ``cls`` is ranked by."""
        return self._class(cls)

    def _enter(self, node: TreeNode, now: int, uses: int, cls: tuple) -> None:
        self._class(cls).entries += len(node.pages)
        self.state[node] = [now, uses, cls]

    @staticmethod
    def _page_hashes(node: TreeNode) -> list[int]:
        ps = len(node.key) // max(len(node.pages), 1)
        return [hash(node.key[i : i + ps]) for i in range(0, len(node.key), ps)] if ps else []

    def added(self, node: TreeNode, now: int) -> None:
        self.now = now
        back = [g for g in (self.ghost.pop(h, None) for h in self._page_hashes(node)) if g is not None]
        for cls, last, _, pages in back:  # evicted pieces of this prefix came back: returns the tree missed
            self._back(cls, now - last, pages)
        if back:
            uses = 1 + max(g[2] for g in back)
            self._enter(node, now, uses, (min(uses, 2), False))
            return
        parent = self.state.get(node.parent) if node.parent is not None else None
        self._enter(node, now, 0, (0, parent is not None and parent[1] > 0))

    def used(self, node: TreeNode, now: int) -> None:
        st = self.state.get(node)
        if st is None:
            return self._enter(node, now, 1, (1, False))
        self._back(st[2], now - st[0], len(node.pages))
        self._enter(node, now, st[1] + 1, (min(st[1] + 1, 2), False))

    def removed(self, node: TreeNode) -> None:
        st = self.state.pop(node, None)
        hashes = self._page_hashes(node)
        if st is None or node.parent is None or not hashes:
            return
        idle = max(self.now - st[0], 1)
        self.turnover = (
            idle if self.turnover == 0 else (1 - TURNOVER_EWMA) * self.turnover + TURNOVER_EWMA * idle
        )
        self.ghost[hashes[0]] = (st[2], st[0], st[1], len(node.pages))
        while len(self.ghost) > self.ghost_size:
            self.ghost.popitem(last=False)

    def priority(self, node: TreeNode, now: int) -> tuple:
        self.now = now
        st = self.state.get(node)
        if st is None:
            return (0.0, node.last_access)
        window = self.turnover or float(1 << 40)
        return (self._stats(st[2]).soon(now - st[0], window), st[0])

    def check(self, tree_pages: int) -> None:
        assert sum(len(n.pages) for n in self.state) == tree_pages, (len(self.state), tree_pages)
        assert all(st[1] >= 0 and st[2][0] == min(st[1], 2) for st in self.state.values())
        assert len(self.ghost) <= self.ghost_size


class ProvenLine:
    """One strict line in front of a ``ReturnHazard`` order: a node whose prefix never proved reuse
    goes first (mixed into ``proven`` and ``proven-answer``)."""

    state: dict

    @staticmethod
    def proven(st: list) -> bool:  # back from the ghost list: it entered with ``uses`` >= 1
        return st[1] > 0 or st[2][:2] == (0, True)

    def priority(self, node: TreeNode, now: int) -> tuple:
        st = self.state.get(node)
        return (st is not None and self.proven(st), *super().priority(node, now))  # type: ignore[misc]

    def state_priority(self, node: TreeNode, now: int) -> tuple:
        # without the line where pages need states: with a tight snapshot budget the line lost the
        # sub-agent window trace (benchmarks/traces/eviction_traces_window.py: 0.54x Belady, hazard's order 0.93x)
        return super().priority(node, now)  # type: ignore[misc]


class ProvenHazard(ProvenLine, ReturnHazard):
    """``hazard`` behind the line."""

    name = "proven"


class OutputHazard(ReturnHazard):
    """``hazard`` with the never-used classes split by how long the answer of the request that wrote them was."""

    name = "answer"

    def finished(self, node: TreeNode, num_prompt: int, num_output: int) -> None:
        answer = min(max(num_output, 1).bit_length(), ANSWER_BUCKETS)
        # the request's own new nodes: never used, up to the prefix it matched (or the root)
        while (
            node is not None and (st := self.state.get(node)) is not None and st[1] == 0 and len(st[2]) == 2
        ):
            st[2] = (*st[2], answer)
            self._class(st[2]).entries += len(
                node.pages
            )  # the fine class; the coarse one counted them on entry
            node = node.parent

    def _back(self, cls: tuple, gap: int, pages: int) -> None:
        super()._back(cls, gap, pages)
        if len(cls) == 3:
            super()._back(cls[:2], gap, pages)

    def _stats(self, cls: tuple) -> ReturnStats:
        fine = self._class(cls)
        return fine if len(cls) == 2 or fine.entries >= MIN_ENTRIES else self._class(cls[:2])

    def check(self, tree_pages: int) -> None:
        super().check(tree_pages)
        assert all(
            len(st[2]) == 2 or (st[1] == 0 and 1 <= st[2][2] <= ANSWER_BUCKETS) for st in self.state.values()
        )


class ProvenOutputHazard(ProvenLine, OutputHazard):
    """``answer``'s classes behind the line (``eviction.py`` says where it wins and loses)."""

    name = "proven-answer"
