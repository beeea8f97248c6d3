"""The radix cache's event hook (``runtime/cache/events.py``): every page stored once and removed once.

A model of what a gateway's index would hold is built only from the events (each stored block's
prefix rebuilt through its parent hashes) and compared with the tree itself after every operation:
random inserts in two tenants and the public namespace, evictions (whole leaves and trimmed tails),
a reset.
"""

from __future__ import annotations

import random

import pytest

from kvreuse.runtime.cache.events import ROOT_HASH, CacheEvents, Cleared, PageEvents, Removed, Stored
from kvreuse.runtime.cache.page_allocator import PageAllocator
from kvreuse.runtime.cache.radix_cache import RadixCache
from kvreuse.runtime.request import PUBLIC, CacheScope
from tests.radix_checks import tree_pages

PS = 4


class Index:
    """What a subscriber learns from the events: live blocks, their tokens, parents and namespaces."""

    def __init__(self) -> None:
        self.live: dict[int, tuple[int, tuple[int, ...], object]] = {}  # hash -> parent, tokens, namespace
        self.stored = self.removed = 0

    def __call__(self, ev) -> None:
        if isinstance(ev, Stored):
            parent = ev.parent_hash
            assert parent == ROOT_HASH or parent in self.live, "a stored run must follow a live block"
            for b in ev.blocks:
                assert b.block_hash not in self.live, "a page stored twice"
                assert len(b.token_ids) == PS
                self.live[b.block_hash] = (parent, b.token_ids, ev.namespace)
                parent = b.block_hash
                self.stored += 1
        elif isinstance(ev, Removed):
            for h in ev.block_hashes:
                assert h in self.live, "a page removed that was never stored (or removed twice)"
                del self.live[h]
                self.removed += 1
        else:
            assert isinstance(ev, Cleared)
            self.live.clear()

    def prefixes(self) -> set[tuple[tuple[int, ...], tuple]]:
        """Every live block's whole prefix and the namespace of each of its pages (rebuilt through the parents)."""
        out = set()
        for h in self.live:
            toks: list[int] = []
            spaces: list = []
            while h != ROOT_HASH:
                parent, tokens, ns = self.live[h]  # a KeyError: a parent removed before its child
                toks[:0], spaces[:0] = tokens, [ns]
                h = parent
            out.add((tuple(toks), tuple(spaces)))
        return out


def tree_prefixes(tree: RadixCache) -> set[tuple[tuple[int, ...], tuple]]:
    """The same, walked from the tree: each page's whole prefix and the namespaces along it."""
    out, stack = set(), [(tree.root, (), ())]
    while stack:
        node, prefix, spaces = stack.pop()
        for i in range(len(node.pages)):
            out.add((prefix + node.key[: (i + 1) * PS], spaces + (node.ns,) * (i + 1)))
        below = (prefix + node.key, spaces + (node.ns,) * len(node.pages))
        stack.extend((c, *below) for c in node.children.values())
    return out


def test_the_default_hook_does_nothing_and_costs_no_listener() -> None:
    tree = RadixCache(PS, PageAllocator(8))
    assert type(tree.events) is CacheEvents
    tree.insert(list(range(8)), tree.allocator.alloc(2))
    tree.evict(2)
    tree.reset()


@pytest.mark.parametrize("policy", ["lru", "hazard"])
@pytest.mark.parametrize("seed", range(4))
def test_events_rebuild_exactly_the_pages_the_tree_holds(policy: str, seed: int) -> None:
    rng = random.Random(seed)
    tree = RadixCache(PS, PageAllocator(48), policy)
    index = Index()
    tree.events = PageEvents(PS, index)
    scopes = [PUBLIC, CacheScope("a"), CacheScope("b"), CacheScope("a", public_len=2 * PS)]
    bases = [[rng.randrange(6) for _ in range(6 * PS)] for _ in range(3)]
    for _ in range(120):
        op = rng.random()
        if op < 0.65:
            base = rng.choice(bases)
            n = rng.randrange(1, 7) * PS
            tokens = base[: rng.randrange(0, n)] + [rng.randrange(6) for _ in range(n)]
            tokens = tokens[: len(tokens) // PS * PS]
            need = len(tokens) // PS
            if tree.allocator.num_free < need:
                tree.evict(need - tree.allocator.num_free)
            if tree.allocator.num_free < need or not tokens:
                continue
            pages = tree.allocator.alloc(need)
            res = tree.insert(tokens, pages, rng.choice(scopes))
            tree.allocator.free([p for p in pages[: res.prefix_len // PS]])
        else:
            tree.evict(rng.randrange(1, 5))
        assert len(index.live) == tree.total_pages
        assert index.prefixes() == tree_prefixes(tree)
        assert {p for p, _ in index.prefixes()} == set(tree_pages(tree))
    assert index.removed > 0 and index.stored == index.removed + tree.total_pages
    tree.reset()
    assert index.live == {}


def test_tenants_and_prefixes_give_different_hashes_and_the_tenant_is_carried() -> None:
    tree = RadixCache(PS, PageAllocator(16))
    got: list = []
    tree.events = PageEvents(PS, got.append)
    page = [7, 7, 7, 7]
    tree.insert(page, tree.allocator.alloc(1), CacheScope("t1"))
    tree.insert(page, tree.allocator.alloc(1), CacheScope("t2"))
    tree.insert(page, tree.allocator.alloc(1))
    tree.insert([1, 2, 3, 4] + page, tree.allocator.alloc(2), CacheScope("t1", public_len=PS))
    assert [ev.namespace for ev in got] == ["t1", "t2", None, None, "t1"]
    assert [len(ev.blocks) for ev in got] == [1, 1, 1, 1, 1]
    hashes = [ev.blocks[0].block_hash for ev in got]
    assert len(set(hashes)) == 5  # the same page: three namespaces, and after another prefix
    assert got[4].parent_hash == hashes[3] and got[3].parent_hash == ROOT_HASH
    assert all(ev.blocks[0].token_ids == tuple(page) for ev in got[:3] + got[4:])
