"""Eviction policies over radix-tree nodes: which unlocked leaf gives up its pages first.

The tree owns the mechanism (which leaves are evictable, freeing pages, trimming a leaf's tail
when fewer pages are needed than it holds); a policy only orders the candidates.  It hears about
every node event and answers two questions:

* ``priority(node, now)``: a sort key, smallest evicted first.  Keys are taken when an eviction
  starts (nothing is accessed during one), so they may depend on ``now``.
* ``finished(node, num_prompt, num_output)``: a request whose cached prefix ends at ``node``
  ended; its lengths are a hint (``answer`` uses them).
* ``spare(node)``: asked just before a popped leaf is evicted; ``True`` means the policy moved
  the node (a second chance, S3-FIFO style) and wants it re-ranked with a fresh ``priority``.

A *use* is a match or insert that reaches a node while no request holds it (``ref == 0``): a
request re-walking the nodes it already locked is bookkeeping, not reuse.  Times are the tree's
clock, one tick per match or insert.

Policies (the trace benchmark, ``benchmarks/traces/eviction_traces.py``, measures them against each
other and against Belady's offline optimum):

* ``lru``: least recently touched first, whole leaves (what the tree always did); ``lru-tail``
  the same, trimming.
* ``slru``: segmented LRU; a node used twice is protected (up to 80% of the tree's pages).
* ``s3fifo``: S3-FIFO over nodes: new nodes enter a small FIFO (10% of pages); a node used there
  moves to the main FIFO, else it is evicted and remembered in a ghost list, so that its return
  goes straight to main; main gives used nodes another lap.
* ``shared``: nodes weighted by the sequences that passed through them, over their age.
* ``reuse``: predicted next use, furthest first (Belady with a forecast).  A node's forecast is
  its last use plus the mean gap between its uses; a node never used takes the gap of its
  nearest ancestor that was (the next turn of a conversation comes back as often as the
  conversation does).  A path with no reuse at all up to the root is a one-off (a scan, or a
  conversation's first turn) and goes first, newest first, so that under cyclic access the
  conversation furthest from returning gives way.  An overdue node (idle longer than its gap)
  is forecast as far again as it has been idle, so sessions that went quiet age out.
* ``hazard`` (default; ``hazard.py``, with ``proven`` and ``answer``): evict the node least likely to be used again before the cache turns
  over.  Nodes fall in classes by how often they were used (never: a first turn, or a new leaf
  under a used path, told apart; once; twice or more), and each class learns online, weighted
  by pages, the share of its nodes that come back and a histogram of how long they took.  A
  node idle for ``t`` ticks scores ``P(back within W | not back by t)`` for its class, ``W``
  the mean idle time of recent victims (how long the cache keeps things now): regular gaps
  (cyclic turns) make the node due soonest the most valuable, spread-out gaps (a production
  chat service) make long-idle nodes the likeliest never to return.  Evicted nodes leave a
  ghost (their first page's hash), so a prefix that comes back after eviction still counts as
  a return for its class, and those returns are not lost to the cache's own misses.
  Production-shaped traces (``benchmarks/traces/trace_replay.py``) are where ``reuse`` fell below LRU.
* ``answer``: ``hazard`` whose never-used classes are split by the length of the answer of the
  request that wrote the node (told through ``finished``; ``hazard.py`` says why).
* ``proven``: ``hazard``'s order on each side of one line, nodes of a prefix that never proved
  reuse (used since it entered, back from the ghost list, or a new leaf under a used path) first.
  On the Mooncake trace most pages enter with a first turn that never returns, and they flush,
  under ``hazard`` and LRU, the conversations that came back once.  Where matches end only at a
  state (window and hybrid models) the line is left out (``state_priority``): ranked by it, a short
  snapshot budget lost the sub-agent window trace.
* ``predict`` (``predict.py``): an online logistic model of whether a node comes back, over the
  node's class and idle time, its uses and gaps, and the lengths of the request that wrote it,
  labelled by the server's own later traffic; lowest predicted chance first.
* ``proven-answer``: ``answer``'s classes behind ``proven``'s line.  At least ``hazard`` in every
  Mooncake trace cell, and 0.986x LRU at worst there.
  Neither line policy is the default: the line keeps every prefix that proved reuse once.  Where
  prefixes return exactly once (documents asked two questions, ``tests/test_eviction.py``), they
  fill the pool and each new first turn goes at once; ``hazard`` keeps some and ``answer`` most.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from kvreuse.runtime.cache.hazard import OutputHazard, ProvenHazard, ProvenOutputHazard, ReturnHazard
from kvreuse.runtime.cache.policy_base import EvictionPolicy, PerNode
from kvreuse.runtime.cache.predict import PredictReturn

if TYPE_CHECKING:
    from kvreuse.runtime.cache.tree_node import TreeNode

__all__ = ["DEFAULT_POLICY", "POLICIES", "EvictionPolicy", "make_policy"]

UNKNOWN = float("inf")  # the forecast of a node with no reuse anywhere on its path


class LRU(EvictionPolicy):
    """Least recently touched first, whole leaves; ``last_access`` is stamped on every walk."""

    name = "lru"
    trim = False

    def priority(self, node: TreeNode, now: int) -> tuple:
        return (node.last_access,)


class LRUTail(LRU):
    """LRU that frees only the tail pages it needs from the last victim."""

    name = "lru-tail"
    trim = True


class SLRU(PerNode):
    """Segmented LRU: probation (used once) is evicted before protected (used again)."""

    name = "slru"

    def __init__(self, protected_share: float = 0.8) -> None:
        super().__init__()
        self.protected_share = protected_share
        self.protected: OrderedDict[TreeNode, int] = OrderedDict()  # node -> its pages when counted
        self.protected_pages = 0
        self.total = 0  # pages of all nodes this policy tracks

    def added(self, node: TreeNode, now: int) -> None:
        self.state[node] = [0]
        self.total += len(node.pages)

    def used(self, node: TreeNode, now: int) -> None:
        if node not in self.protected:
            self.protected[node] = len(node.pages)
            self.protected_pages += len(node.pages)
        self.protected.move_to_end(node)
        cap = self.protected_share * self.total
        while self.protected_pages > cap and len(self.protected) > 1:
            _, pages = self.protected.popitem(last=False)  # demoted to probation
            self.protected_pages -= pages

    def split(self, upper: TreeNode, lower: TreeNode) -> None:
        if lower in self.state:
            self.state[upper] = list(self.state[lower])
        if lower in self.protected:  # the pages move from the lower part to the upper one
            self.protected[lower] -= len(upper.pages)
            self.protected[upper] = len(upper.pages)

    def removed(self, node: TreeNode) -> None:
        self.protected_pages -= self.protected.pop(node, 0)
        if self.state.pop(node, None) is not None:
            self.total -= len(node.pages)

    def priority(self, node: TreeNode, now: int) -> tuple:
        return (node in self.protected, node.last_access)

    def check(self, tree_pages: int) -> None:
        assert self.total == tree_pages, (self.total, tree_pages)
        assert all(pages == len(n.pages) for n, pages in self.protected.items())
        assert self.protected_pages == sum(self.protected.values())


class S3FIFO(PerNode):
    """S3-FIFO (Yang et al., SOSP'23) with radix nodes as objects and pages as sizes."""

    name = "s3fifo"

    def __init__(self, small_share: float = 0.1, ghost_size: int = 4096) -> None:
        super().__init__()
        self.small_share = small_share
        self.ghost: OrderedDict[tuple, None] = OrderedDict()
        self.ghost_size = ghost_size
        self.seq = 0
        self.pages = [0, 0]  # small, main

    def _ident(self, node: TreeNode) -> tuple:
        return (node.parent.uid if node.parent is not None else -1, node.key[:64])

    def _enqueue(self, node: TreeNode, queue: int, freq: int) -> None:
        self.seq += 1
        self.state[node] = [queue, freq, self.seq]

    def added(self, node: TreeNode, now: int) -> None:
        ident = self._ident(node)
        queue = 1 if ident in self.ghost else 0
        self.ghost.pop(ident, None)
        self._enqueue(node, queue, 0)
        self.pages[queue] += len(node.pages)

    def used(self, node: TreeNode, now: int) -> None:
        st = self.state.get(node)
        if st is not None:
            st[1] = min(st[1] + 1, 3)

    def split(self, upper: TreeNode, lower: TreeNode) -> None:
        if lower in self.state:
            self.state[upper] = list(self.state[lower])  # pages were already counted once

    def removed(self, node: TreeNode) -> None:
        st = self.state.pop(node, None)
        if st is None:
            return
        self.pages[st[0]] -= len(node.pages)
        if st[0] == 0:
            self.ghost[self._ident(node)] = None
            while len(self.ghost) > self.ghost_size:
                self.ghost.popitem(last=False)

    def check(self, tree_pages: int) -> None:
        assert sum(self.pages) == tree_pages, (self.pages, tree_pages)

    def priority(self, node: TreeNode, now: int) -> tuple:
        st = self.state.get(node, [0, 0, 0])
        small_first = self.pages[0] > self.small_share * (self.pages[0] + self.pages[1])
        return (st[0] if small_first else 1 - st[0], st[2])

    def spare(self, node: TreeNode) -> bool:
        st = self.state.get(node)
        if st is None or st[1] == 0:
            return False
        queue, freq, _ = st
        if queue == 0:  # used while on probation: promote to main
            self.pages[0] -= len(node.pages)
            self.pages[1] += len(node.pages)
            self._enqueue(node, 1, 0)
        else:  # one more lap in main
            self._enqueue(node, 1, freq - 1)
        return True


class Shared(PerNode):
    """Sequences through a node per tick of age: a shared, recently used prefix scores high."""

    name = "shared"

    def added(self, node: TreeNode, now: int) -> None:
        self.state[node] = [1, now]  # the sequence that created it

    def used(self, node: TreeNode, now: int) -> None:
        st = self.state.setdefault(node, [0, now])
        st[0] += 1
        st[1] = now

    def priority(self, node: TreeNode, now: int) -> tuple:
        uses, last = self.state.get(node, [1, node.last_access])
        return (uses / (now - last + 1), node.last_access)


class ReuseForecast(PerNode):
    """Evict the node whose forecast next use is furthest away (see the module docstring)."""

    name = "reuse"

    def added(self, node: TreeNode, now: int) -> None:
        self.state[node] = [now, 0.0]  # last use (or creation), mean gap (0: never used)

    def used(self, node: TreeNode, now: int) -> None:
        st = self.state.setdefault(node, [now, 0.0])
        gap = now - st[0]
        if gap > 0:
            st[1] = gap if st[1] == 0 else 0.5 * (st[1] + gap)
        st[0] = now

    def priority(self, node: TreeNode, now: int) -> tuple:
        last, gap = self.state.get(node, [node.last_access, 0.0])
        ancestor = node.parent
        while gap == 0 and ancestor is not None:
            gap = self.state.get(ancestor, (0, 0.0))[1]
            ancestor = ancestor.parent
        if gap == 0:  # nothing on its path was ever reused: a one-off, newest first
            return (-UNKNOWN, -last)
        idle = now - last
        forecast = now + idle if idle > gap else last + gap
        return (-forecast, -node.last_access)


DEFAULT_POLICY = (
    "hazard"  # chosen on the first half of the Mooncake trace: benchmarks/results/trace_replay.json
)
POLICIES: dict[str, type[EvictionPolicy]] = {
    p.name: p
    for p in (
        LRU,
        LRUTail,
        SLRU,
        S3FIFO,
        Shared,
        ReuseForecast,
        ReturnHazard,
        ProvenHazard,
        OutputHazard,
        ProvenOutputHazard,
        PredictReturn,
    )
}


def make_policy(name: str) -> EvictionPolicy:
    """A fresh policy by name; a clear error lists the choices."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; choose from {', '.join(POLICIES)}") from None
