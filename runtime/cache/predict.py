"""The ``predict`` eviction policy: evict the node least likely to be used again, as an online logistic
model (``return_model.ReturnModel``) predicts from what the server itself has seen.

Features of a node (all known to the engine when it evicts; nothing reads ahead):

* its class (never used: a first turn, or a new leaf under a used path; used once; twice or more)
  crossed with how long it has been idle relative to the cache's turnover (log2 buckets): the
  model's hazard table;
* how many times it was used, whether it came back from the ghost list (evicted, then requested),
  its idle time against its own last gap between uses;
* the prompt and answer lengths of the request that wrote it (``finished``), its pages, and how
  deep in the prefix it starts.

Labels come from the server's own future, once it is past: a node scored at an eviction is
*sampled* (one node in ``SAMPLE_EVERY``, by its first page's hash); it is a positive if a request reaches it (or its
ghost) within ``HORIZON`` turnovers, a negative once that time has passed without one.  The same
labels give the calibration and the kept-vs-evicted return rates (``return_model.Outcomes``).

The order is by expected value per page held: a node that returns saves every one of its pages,
so the tokens saved per page held are the page size for every node and the order is the
probability alone: smallest first, in bins of its log-odds ``LOGIT_BIN`` wide with the least
recently used first within a bin (a fresh model predicts 0.5 everywhere, which is LRU).  The bins
keep recency wherever the model cannot tell nodes apart by more than that: ordered by the exact
probability, a pool of 30% of the conversation trace fell to 0.80x LRU (``docs/traces.md``).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from typing import TYPE_CHECKING

from kvreuse.runtime.cache.policy_base import PerNode
from kvreuse.runtime.cache.return_model import Outcomes, ReturnModel, sigmoid

if TYPE_CHECKING:
    from kvreuse.runtime.cache.tree_node import TreeNode

HORIZON = 1.0  # a sampled node is a positive if back within this many turnovers (4: below LRU, traces.md)
LOGIT_BIN = 0.5  # nodes whose predicted log-odds share a bin this wide go least recently used first
LOGIT_CAP = math.log((1 - 1e-9) / 1e-9)  # log-odds beyond this share the end bins (p within 1e-9 of 0 or 1)
SAMPLE_EVERY = 1  # 1 node in this many (by first-page hash) gives examples; 8 starved agents
IDLE_BUCKETS = 8  # log2(idle / turnover) from -4 to +3
CLASSES = 4
OUT_BUCKETS = 12
# feature layout: class x idle crosses, class one-hots, then the scalar and one-hot features below
CROSS = 0
CLASS = CROSS + CLASSES * IDLE_BUCKETS
BIAS, GHOST, USES, GAP, HAS_GAP, PROMPT, PAGES, DEPTH, NO_OUTPUT = range(CLASS + CLASSES, CLASS + CLASSES + 9)
OUTPUT = NO_OUTPUT + 1
N_FEATURES = OUTPUT + OUT_BUCKETS

# per-node state: [last use, uses, last gap, class, ghost, prompt, output, depth tokens, first page hash,
# the features that do not move with time (None until scored, and again after any change)]
LAST, NUSES, LGAP, CLS, GHOSTED, NPROMPT, NOUT, DEPTH_T, HASH, STATIC = range(10)


def _log2(x: float) -> float:
    return max(int(x), 1).bit_length() - 1.0


class PredictReturn(PerNode):
    """Evict the node the online model gives the lowest chance of coming back (module docstring)."""

    name = "predict"

    def __init__(self, ghost_size: int = 1 << 16) -> None:
        super().__init__()
        self.model = ReturnModel(N_FEATURES)
        self.outcomes = Outcomes()
        self.ghost: OrderedDict[int, int] = OrderedDict()  # first page's hash -> uses when evicted
        self.ghost_size = ghost_size
        self.pending: OrderedDict[int, list] = OrderedDict()  # hash -> [time, features, p, evicted, returned]
        # the turnover: ticks in which the tree took in as many new pages as it holds (a measure of how
        # long the cache keeps things that does not depend on what this policy chose to evict)
        self.turnover = 0.0
        self.pages = 0  # pages of the nodes this policy tracks
        self.inserted = 0  # pages ever added
        self.marks: deque[tuple[int, int]] = deque()  # (tick, pages ever added then)
        self.now = 0

    # -- features -----------------------------------------------------------------
    def features(self, st: list, pages: int, now: int) -> list[tuple[int, float]]:
        """The node's features, sparse: (index, value) pairs; the part that does not move with time is
        kept in the node's state until the state changes."""
        static = st[STATIC]
        if static is None:
            static = st[STATIC] = [
                (CLASS + st[CLS], 1.0),
                (BIAS, 1.0),
                (USES, _log2(1 + st[NUSES]) / 3),
                (PROMPT, _log2(st[NPROMPT] + 1) / 16),
                (PAGES, _log2(pages + 1) / 8),
                (DEPTH, _log2(st[DEPTH_T] + 1) / 16),
                (NO_OUTPUT, 1.0)
                if st[NOUT] < 0
                else (OUTPUT + min(max(st[NOUT], 1).bit_length() - 1, OUT_BUCKETS - 1), 1.0),
            ]
            if st[GHOSTED]:
                static.append((GHOST, 1.0))
            if st[LGAP]:
                static.append((HAS_GAP, 1.0))
        idle = now - st[LAST]
        b = min(max(int(_log2((idle + 1) / (self.turnover or 1.0) * 16)), 0), IDLE_BUCKETS - 1)
        x = [(CROSS + st[CLS] * IDLE_BUCKETS + b, 1.0), *static]
        if st[LGAP]:
            x.append((GAP, max(-2.0, min(2.0, (_log2(idle + 1) - _log2(st[LGAP] + 1)) / 4))))
        return x

    # -- labels -------------------------------------------------------------------
    def _returned(self, h: int) -> None:
        rec = self.pending.get(h)
        if rec is not None and not rec[4]:
            self.model.learn(rec[1], True)  # the model learns a return at once
            rec[4] = True

    def _expire(self, now: int) -> None:
        """Records whose horizon has passed: a negative for the model unless it came back; every one
        an outcome then, returned or not, so the figures do not favour the returns that resolve early."""
        horizon = HORIZON * max(self.turnover, 1.0)
        while self.pending:
            h, rec = next(iter(self.pending.items()))
            if now - rec[0] <= horizon:
                break
            del self.pending[h]
            if not rec[4]:
                self.model.learn(rec[1], False)
            self.outcomes.add(rec[2], rec[4], rec[3])

    # -- hooks --------------------------------------------------------------------
    @staticmethod
    def _page_hashes(node: TreeNode) -> list[int]:
        ps = len(node.key) // max(len(node.pages), 1)
        return [hash(node.key[i : i + ps]) for i in range(0, len(node.key), ps)] if ps else []

    def added(self, node: TreeNode, now: int) -> None:
        self.now = now
        hashes = self._page_hashes(node)
        back = [u for u in (self.ghost.pop(h, None) for h in hashes) if u is not None]
        for h in hashes:
            if h in self.pending:
                self._returned(h)
        parent = self.state.get(node.parent) if node.parent is not None else None
        depth = parent[DEPTH_T] + len(node.parent.key) if parent is not None else 0  # type: ignore[union-attr]
        uses = 1 + max(back) if back else 0
        cls = min(uses, 2) + 1 if uses else int(parent is not None and parent[NUSES] > 0)
        h0 = hashes[0] if hashes else 0
        self.state[node] = [now, uses, 0, cls, bool(back), 0, -1, depth, h0, None]
        self._tick(now, len(node.pages))
        self._expire(now)

    def _tick(self, now: int, pages: int) -> None:
        self.pages += pages
        self.inserted += pages
        self.marks.append((now, self.inserted))
        while len(self.marks) > 1 and self.marks[1][1] <= self.inserted - self.pages:
            self.marks.popleft()
        if self.marks[0][1] <= self.inserted - self.pages:
            self.turnover = max(now - self.marks[0][0], 1)

    def used(self, node: TreeNode, now: int) -> None:
        self.now = now
        st = self.state.get(node)
        if st is None:
            hashes = self._page_hashes(node)
            self.state[node] = [now, 1, 0, 2, False, 0, -1, 0, hashes[0] if hashes else 0, None]
            self.pages += len(node.pages)
            return
        if st[HASH] in self.pending:
            self._returned(st[HASH])
        st[LGAP] = max(now - st[LAST], 1)
        st[LAST] = now
        st[NUSES] += 1
        st[CLS] = min(st[NUSES], 2) + 1
        st[STATIC] = None

    def split(self, upper: TreeNode, lower: TreeNode) -> None:
        st = self.state.get(lower)
        if st is None:
            return
        self.state[upper] = [*st[:STATIC], None]  # the upper part keeps the first page, its hash, any record
        st[STATIC] = None
        hashes = self._page_hashes(lower)
        st[HASH] = hashes[0] if hashes else 0
        st[DEPTH_T] += len(upper.key)

    def finished(self, node: TreeNode, num_prompt: int, num_output: int) -> None:
        # the request's own new nodes: never used, up to the prefix it matched (or the root)
        while (
            node is not None and (st := self.state.get(node)) is not None and st[NUSES] == 0 and st[NOUT] < 0
        ):
            st[NPROMPT], st[NOUT], st[STATIC] = num_prompt, num_output, None
            node = node.parent

    def removed(self, node: TreeNode) -> None:
        st = self.state.pop(node, None)
        if st is None:
            return
        self.pages -= len(node.pages)
        rec = self.pending.get(st[HASH])
        if rec is not None and not rec[4]:  # evicted before it came back
            rec[3] = True
        self.ghost[st[HASH]] = st[NUSES]
        while len(self.ghost) > self.ghost_size:
            self.ghost.popitem(last=False)

    def priority(self, node: TreeNode, now: int) -> tuple:
        self.now = now
        st = self.state.get(node)
        if st is None:
            return (0.0, node.last_access)
        x = self.features(st, len(node.pages), now)
        z = self.model.log_odds(x)
        p = sigmoid(z)
        # sampled by the node, not by the count of scores, so an eviction shadow that scores as often
        # or less often as the pool learns the same examples (``runtime/cache/shadows.py``)
        if st[HASH] % SAMPLE_EVERY == 0 and st[HASH] not in self.pending:
            self.pending[st[HASH]] = [now, x, p, False, False]
        # log-odds in bins, LRU within a bin: differences finer than that were the model's noise and
        # cost the large pools their recency (0.80x LRU at 30% of the conversation half, docs/traces.md)
        return (math.floor(min(max(z, -LOGIT_CAP), LOGIT_CAP) / LOGIT_BIN), st[LAST])

    def predictor(self) -> dict:
        """What the model has learned to tell apart on this server's traffic (``GET /v1/cache``)."""
        return {"examples": self.model.examples, **self.outcomes.summary()}

    def check(self, tree_pages: int) -> None:
        assert all(st[CLS] == (min(st[NUSES], 2) + 1 if st[NUSES] else st[CLS]) for st in self.state.values())
        assert all(st[CLS] in (0, 1) for st in self.state.values() if st[NUSES] == 0)
        assert len(self.ghost) <= self.ghost_size
