"""Radix cache property test: random insert/match/lock/unlock/evict against a page-level model.

Every eviction policy runs it; LRU order is checked for ``lru``, exact frees for trimming policies.
With per-node states (a hybrid model's snapshots) the model also keeps which prefixes have a state,
the least recently used going first within a budget, and a match must end at the longest matched prefix that has one.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvreuse.runtime.cache.eviction import POLICIES
from kvreuse.runtime.cache.node_states import NodeStates
from kvreuse.runtime.cache.page_allocator import PageAllocator
from kvreuse.runtime.cache.radix_cache import MatchResult, RadixCache, TreeNode
from tests.radix_checks import check_structure, node_ends, path_tokens, tree_pages, tree_states

NUM_PAGES = 24
tokens_st = st.lists(st.integers(0, 2), max_size=9)  # tiny vocab so prefixes collide often
op_st = st.one_of(
    st.tuples(st.just("insert"), tokens_st, st.booleans(), st.lists(st.booleans(), max_size=9)),
    st.tuples(st.just("match"), tokens_st),
    st.tuples(st.just("lock"), tokens_st),
    st.tuples(st.just("unlock"), st.integers(0, 100)),
    st.tuples(st.just("evict"), st.integers(0, 3)),
)


class State(NamedTuple):
    """A stand-in state: which prefix it was taken after, and a size."""

    prefix: tuple[int, ...]
    nbytes: int = 1


class Harness:
    """Drives a RadixCache like an engine would and keeps the model: page-aligned prefix -> page id
    (and, with ``max_states``, prefix -> state, at most that many: the least recently used prefix's
    state goes first, the tree's ``lru`` order, which ranks states too)."""

    def __init__(self, ps: int, policy: str = "lru", max_states: int | None = None) -> None:
        self.ps = ps
        store = None if max_states is None else NodeStates(max_states * State(()).nbytes)
        self.tree = RadixCache(ps, PageAllocator(NUM_PAGES), policy, store)
        self.max_states = max_states
        self.states: OrderedDict[tuple[int, ...], State] = OrderedDict()
        self.model: dict[tuple[int, ...], int] = {}
        self.locks: list[tuple[TreeNode, tuple[int, ...]]] = []
        self.clock = 0
        self.stamps: dict[tuple[int, ...], int] = {}  # model's own last-access time per prefix

    def touch(self, tokens: tuple[int, ...], n_pages: int) -> None:
        self.clock += 1
        for i in range(1, n_pages + 1):
            self.stamps[tokens[: i * self.ps]] = self.clock

    def tree_match(self, tokens: tuple[int, ...]) -> MatchResult:
        m = self.tree.match(tokens)
        self.touch(tokens, (m.cached_len + m.cut_len) // self.ps)  # the whole KV path is a use
        return m

    def model_match(self, tokens: tuple[int, ...]) -> int:
        n = 0
        while (n + 1) * self.ps <= len(tokens) and tokens[: (n + 1) * self.ps] in self.model:
            n += 1
        return n

    def locked_prefixes(self) -> set[tuple[int, ...]]:
        return {p[: i * self.ps] for _, p in self.locks for i in range(1, len(p) // self.ps + 1)}

    def usable(self, tokens: tuple[int, ...], n: int) -> int:
        """Pages of the model's match of ``n`` pages that a match may return: up to the last state."""
        if self.max_states is None:
            return n
        return max((k for k in range(1, n + 1) if tokens[: k * self.ps] in self.states), default=0)

    def match(self, tokens: tuple[int, ...]) -> None:
        n = self.model_match(tokens)
        k = self.usable(tokens, n)
        nodes = self.tree.num_nodes
        assert self.tree.peek_len(tokens) == k * self.ps and self.tree.num_nodes == nodes
        m = self.tree_match(tokens)
        assert (m.cached_len, m.cut_len) == (k * self.ps, (n - k) * self.ps)
        assert m.pages == [self.model[tokens[: (i + 1) * self.ps]] for i in range(k)]
        assert path_tokens(m.handle) == tokens[: m.cached_len]
        assert m.state == self.states.get(tokens[: m.cached_len])
        if m.state is not None:
            self.states.move_to_end(tokens[: m.cached_len])

    def lock(self, tokens: tuple[int, ...]) -> None:
        m = self.tree_match(tokens)
        if m.state is not None:  # a match is a use of its state, whatever the caller does next
            self.states.move_to_end(tokens[: m.cached_len])
        self.tree.lock(m.handle)
        self.locks.append((m.handle, tokens[: m.cached_len]))

    def unlock(self, index: int) -> None:
        if self.locks:
            handle, _ = self.locks.pop(index % len(self.locks))
            self.tree.unlock(handle)

    def evict(self, n: int) -> None:
        before, evictable, locked = tree_pages(self.tree), self.tree.evictable_pages, self.locked_prefixes()
        ends = node_ends(self.tree)
        leaves = {path_tokens(leaf) for leaf in self.tree._evictable}
        freed = self.tree.evict(n)
        after = tree_pages(self.tree)
        assert after.items() <= before.items()
        removed = before.keys() - after.keys()
        assert freed == len(removed) and not removed & locked
        assert freed >= n if evictable >= n else freed == evictable
        held = set(self.states) if self.max_states else set()
        if self.tree.policy.trim:  # only the tail pages needed go, unless the last victim ends at a state
            assert freed == min(n, evictable) or (freed > n and any(ends[p] in held for p in removed))
        assert all(self.tree.allocator.is_free(before[p]) for p in removed)
        if self.tree.policy.name == "lru":
            # nothing evicted was used more recently than a leaf that could have gone instead, within
            # each class: with states, leaves no match can end at (no state at their node's end) go first
            left = [path_tokens(leaf) for leaf in self.tree._evictable]
            gone_cls = {p: ends[p] in held for p in removed}
            for cls in (False, True):
                gone = [self.stamps[p] for p in removed if gone_cls[p] == cls]
                kept = [self.stamps[p] for p in left if p in leaves and (p in held) == cls]  # leaves before
                if gone and kept:
                    assert max(gone) <= min(kept)
            if any(gone_cls.values()):  # a leaf with a state went: no leaf without one was passed over
                assert all(p in held for p in left if p in leaves)
        self.model = after
        for p in [p for p in self.states if p not in after]:  # a state goes with its node
            del self.states[p]

    def alloc(self, n: int) -> list[int] | None:
        short = n - self.tree.allocator.num_free
        if short > 0:
            self.evict(short)
        return self.tree.allocator.alloc(n) if n <= self.tree.allocator.num_free else None

    def insert(self, tokens: tuple[int, ...], reuse: bool, with_state: list[bool] = ()) -> None:
        tokens = tokens[: len(tokens) // self.ps * self.ps]
        n_pages = len(tokens) // self.ps
        m = self.tree_match(tokens) if reuse else None
        if m is not None and m.state is not None:
            self.states.move_to_end(tokens[: m.cached_len])
        if m is not None:
            self.tree.lock(m.handle)  # keep the reused prefix alive while allocating the rest
        new = self.alloc(n_pages - len(m.pages) if m else n_pages)
        if new is not None:
            pages = (m.pages if m else []) + new
            present = self.model_match(tokens)
            ends = [(i + 1) * self.ps for i, on in enumerate(with_state[:n_pages]) if on]
            extra = [(n, State(tokens[:n])) for n in ends]
            res = self.tree.insert(tokens, pages, extra=extra)
            self.touch(tokens, n_pages)
            assert res.prefix_len == present * self.ps
            assert path_tokens(res.handle) == tokens
            dup = [p for i, p in enumerate(pages[:present]) if p != self.model[tokens[: (i + 1) * self.ps]]]
            assert len(dup) == present - (len(m.pages) if m else 0)
            self.tree.allocator.free(dup)
            for i in range(present, n_pages):
                self.model[tokens[: (i + 1) * self.ps]] = pages[i]
            assert res.pages == [self.model[tokens[: (i + 1) * self.ps]] for i in range(n_pages)]
            for n, state in extra if self.max_states else ():
                if tokens[:n] in self.states:  # the same prefix's state is kept, now recently used
                    self.states.move_to_end(tokens[:n])
                    continue
                while len(self.states) >= self.max_states:  # the least recently used prefix's state
                    del self.states[min(self.states, key=lambda q: self.stamps.get(q, 0))]
                self.states[tokens[:n]] = state
        if m is not None:
            self.tree.unlock(m.handle)

    def check(self) -> None:
        assert tree_pages(self.tree) == self.model
        assert tree_states(self.tree) == dict(self.states)
        check_structure(self.tree, [h for h, _ in self.locks])
        self.tree.policy.check(self.tree.total_pages)
        for handle, prefix in self.locks:
            assert path_tokens(handle) == prefix
        assert self.tree.locked_pages == len(self.locked_prefixes())
        assert not any(self.tree.allocator.is_free(self.model[p]) for p in self.locked_prefixes())


@pytest.mark.parametrize("policy", list(POLICIES))
@settings(max_examples=150, deadline=None)
@given(ps=st.sampled_from([1, 2, 3]), ops=st.lists(op_st, max_size=50))
def test_random_operations_agree_with_model(policy: str, ps: int, ops: list[tuple]) -> None:
    _drive(Harness(ps, policy), ops)


@pytest.mark.parametrize("policy", ["lru", "lru-tail"])
@settings(max_examples=150, deadline=None)
@given(ps=st.sampled_from([1, 2, 3]), max_states=st.integers(1, 6), ops=st.lists(op_st, max_size=50))
def test_random_operations_with_node_states_agree_with_model(
    policy: str, ps: int, max_states: int, ops: list[tuple]
) -> None:
    _drive(Harness(ps, policy, max_states), ops)


def _drive(h: Harness, ops: list[tuple]) -> None:
    for op, *args in ops:
        if op in ("insert", "match", "lock"):
            args[0] = tuple(args[0])
        getattr(h, op)(*args)
        h.check()
    while h.locks:
        h.unlock(0)
    assert h.tree.evictable_pages == h.tree.total_pages
    h.tree.reset()
    assert h.tree.allocator.num_free == NUM_PAGES and h.tree.num_nodes == 0
    assert tree_states(h.tree) == {} and h.tree.stats().states == h.tree.stats().state_bytes == 0
