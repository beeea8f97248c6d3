"""Radix cache of KV pages and its page allocator: unit tests on hand-built trees."""

from __future__ import annotations

import pytest

from kvreuse.runtime.cache.page_allocator import OutOfPages, PageAllocator
from kvreuse.runtime.cache.radix_cache import RadixCache
from tests.radix_checks import check_structure, insert_fresh, path_tokens, seq

# ---------------------------------------------------------------- allocator


def test_allocator_alloc_free_and_errors() -> None:
    alloc = PageAllocator(8)
    a = alloc.alloc(5)
    assert len(set(a)) == 5 and all(0 <= p < 8 for p in a) and alloc.num_free == 3
    with pytest.raises(OutOfPages):
        alloc.alloc(4)
    assert alloc.num_free == 3  # a failed alloc takes nothing
    alloc.free(a[:2])
    with pytest.raises(ValueError, match="double free"):
        alloc.free([a[0]])
    with pytest.raises(ValueError, match="out of range"):
        alloc.free([8])
    with pytest.raises(ValueError):
        alloc.free([a[2], a[2]])
    assert alloc.num_free == 5  # rejected frees change nothing
    b = alloc.alloc(5)
    assert set(b) | set(a[2:]) == set(range(8))
    assert alloc.alloc(0) == [] and alloc.num_free == 0


# ---------------------------------------------------------------- match / insert


@pytest.fixture
def make_tree():
    def make(page_size: int, num_pages: int = 64) -> RadixCache:
        return RadixCache(page_size, PageAllocator(num_pages), "lru")  # these tests pin LRU order

    return make


def test_match_on_empty_tree(make_tree) -> None:
    tree = make_tree(4)
    m = tree.match(seq(10))
    assert m.handle is tree.root and m.cached_len == 0 and m.pages == []
    check_structure(tree, [])


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_insert_then_match_whole_pages_only(make_tree, ps: int) -> None:
    tree = make_tree(ps)
    tokens = seq(3 * ps, start=100)
    pages = tree.allocator.alloc(3)
    res = tree.insert(tokens, pages)
    assert res.prefix_len == 0 and path_tokens(res.handle) == tuple(tokens)
    check_structure(tree, [])

    full = tree.match(tokens + [7, 7, 7])
    assert full.cached_len == 3 * ps and full.pages == pages
    # A query ending mid-page only gets the whole pages before that point.
    for n in range(0, 3 * ps + 1):
        m = tree.match(tokens[:n])
        assert m.cached_len == (n // ps) * ps and m.pages == pages[: n // ps]
        assert path_tokens(m.handle) == tuple(tokens[: m.cached_len])
    # Diverging inside page 1 keeps only page 0.
    diverged = tokens[:ps] + [-1] + tokens[ps + 1 :]
    m = tree.match(diverged)
    assert m.cached_len == ps and m.pages == pages[:1]
    check_structure(tree, [])
    with pytest.raises(ValueError, match="whole pages"):
        tree.insert(seq(ps + 1), tree.allocator.alloc(1))


def test_split_in_the_middle_of_a_node(make_tree) -> None:
    tree = make_tree(2)
    pages = tree.allocator.alloc(3)
    tree.insert([1, 2, 3, 4, 5, 6], pages)
    assert tree.num_nodes == 1
    m = tree.match([1, 2, 3, 4, 9, 9])
    assert m.cached_len == 4 and m.pages == pages[:2]
    upper = m.handle
    assert upper.key == (1, 2, 3, 4) and upper.pages == pages[:2]
    (lower,) = upper.children.values()
    assert lower.key == (5, 6) and lower.pages == pages[2:] and lower.parent is upper
    assert tree.num_nodes == 2 and tree.total_pages == 3
    assert tree.match([1, 2, 3, 4, 5, 6]).pages == pages  # nothing lost by the split
    check_structure(tree, [])


def test_split_copies_ref_count_so_existing_locks_still_hold(make_tree) -> None:
    tree = make_tree(1, num_pages=8)
    res = tree.insert([1, 2, 3, 4], tree.allocator.alloc(4))
    tree.lock(res.handle)
    tree.match([1, 2, 9])  # splits the locked node after 2 tokens
    check_structure(tree, [res.handle])
    assert path_tokens(res.handle) == (1, 2, 3, 4)
    assert tree.evict(100) == 0 and tree.locked_pages == 4
    tree.unlock(res.handle)
    assert tree.evict(100) == 4 and tree.allocator.num_free == 8
    check_structure(tree, [])


def test_insert_prefix_len_and_page_ownership(make_tree) -> None:
    ps, num_pages = 4, 16
    tree = make_tree(ps, num_pages)
    alloc = tree.allocator
    a_tokens = seq(4 * ps)
    a_pages = alloc.alloc(4)
    assert tree.insert(a_tokens, a_pages).prefix_len == 0
    check_structure(tree, [])

    # A request that computed its whole KV itself shares 2 pages with A: it frees its 2 duplicates.
    b_tokens = a_tokens[: 2 * ps] + seq(2 * ps, start=500)
    b_pages = alloc.alloc(4)
    check_structure(tree, [], held=4)
    res = tree.insert(b_tokens, b_pages)
    assert res.prefix_len == 2 * ps
    check_structure(tree, [], held=2)
    alloc.free(b_pages[:2])
    check_structure(tree, [])
    assert tree.match(b_tokens).pages == a_pages[:2] + b_pages[2:]

    # A request that reused the tree's pages via match passes those ids back; nobody frees them.
    m = tree.match(a_tokens[: 3 * ps] + [-1] * ps)
    assert m.pages == a_pages[:3]
    tree.lock(m.handle)
    new = alloc.alloc(2)
    c_tokens = a_tokens[: 3 * ps] + seq(2 * ps, start=900)
    res = tree.insert(c_tokens, m.pages + new)
    tree.unlock(m.handle)
    assert res.prefix_len == 3 * ps and path_tokens(res.handle) == tuple(c_tokens)
    check_structure(tree, [])
    assert tree.insert(c_tokens, alloc.alloc(5)).prefix_len == 5 * ps  # fully present already
    check_structure(tree, [], held=5)


# ---------------------------------------------------------------- lock / evict / reset


def test_lock_unlock_counts_up_to_root(make_tree) -> None:
    tree = make_tree(1)
    insert_fresh(tree, [1, 2, 3])
    leaf = insert_fresh(tree, [1, 2, 3, 4, 5]).handle
    mid = leaf.parent
    assert mid is not None and mid.key == (1, 2, 3)
    tree.lock(leaf)
    tree.lock(mid)
    assert (leaf.ref, mid.ref) == (1, 2)
    assert tree.locked_pages == 5 and tree.evictable_pages == 0
    check_structure(tree, [leaf, mid])
    tree.unlock(leaf)
    assert (leaf.ref, mid.ref) == (0, 1) and tree.locked_pages == 3 and tree.evictable_pages == 2
    tree.unlock(mid)
    with pytest.raises(ValueError, match="not locked"):
        tree.unlock(mid)
    assert (leaf.ref, mid.ref) == (0, 0)
    check_structure(tree, [])


def test_evict_is_lru_one_page_at_a_time(make_tree) -> None:
    tree = make_tree(2, num_pages=8)
    keys = [[k, k] for k in range(4)]
    pages = [tree.insert(key, tree.allocator.alloc(1)).handle.pages[0] for key in keys]
    order = (2, 0, 3, 1)
    for k in order:  # access order: 2 is now the least recent, 1 the most
        tree.match(keys[k])
    for i, k in enumerate(order):
        assert tree.evict(1) == 1
        assert tree.allocator.is_free(pages[k])
        # Read survivors off the root directly: a match would refresh their access time.
        assert {child.key[0] for child in tree.root.children.values()} == set(order[i + 1 :])
        check_structure(tree, [])
    assert tree.evict(1) == 0 and tree.evicted_pages_total == 4


def test_insert_counts_as_an_access(make_tree) -> None:
    tree = make_tree(1, num_pages=8)
    for k in range(3):
        insert_fresh(tree, [k])
    insert_fresh(tree, [0])  # already present: only its access time changes
    insert_fresh(tree, [3])  # a brand-new leaf is the most recent of all
    assert tree.evict(1) == 1
    assert {child.key[0] for child in tree.root.children.values()} == {0, 2, 3}
    assert tree.evict(2) == 2
    assert {child.key[0] for child in tree.root.children.values()} == {3}


def test_peek_len_neither_splits_nor_refreshes(make_tree) -> None:
    tree = make_tree(2, num_pages=8)
    insert_fresh(tree, [1, 1, 2, 2, 3, 3])
    insert_fresh(tree, [5, 5])
    assert tree.peek_len([1, 1, 2, 2, 9, 9]) == 4 and tree.peek_len([1, 1, 2]) == 2
    assert tree.peek_len([1, 1, 2, 2, 3, 3, 4]) == 6 and tree.peek_len([7, 7]) == 0
    assert tree.num_nodes == 2
    assert tree.evict(1) == 3  # [1 1 2 2 3 3] is still the least recently used
    assert tree.peek_len([5, 5]) == 2


def test_locked_nodes_are_never_evicted_even_if_oldest(make_tree) -> None:
    tree = make_tree(1, num_pages=8)
    old = insert_fresh(tree, [1, 1]).handle
    insert_fresh(tree, [2, 2])
    insert_fresh(tree, [3, 3])
    tree.lock(old)
    assert tree.evict(2) == 2
    assert tree.match([1, 1]).cached_len == 2 and tree.match([2, 2]).cached_len == 0
    assert tree.evict(10) == 2 and tree.total_pages == 2 == tree.locked_pages
    check_structure(tree, [old])
    tree.unlock(old)
    assert tree.evict(10) == 2 and tree.allocator.num_free == 8


def test_evicting_a_leaf_makes_its_parent_evictable(make_tree) -> None:
    tree = make_tree(1, num_pages=16)
    insert_fresh(tree, [1, 2])
    insert_fresh(tree, [1, 2, 3, 4])
    insert_fresh(tree, [9])  # the most recent: evicted last
    parent = tree.match([1, 2]).handle
    tree.match([9])
    assert parent not in tree._evictable
    assert tree.evict(1) == 2  # the [3, 4] leaf goes first, whole
    assert parent in tree._evictable and not parent.children
    check_structure(tree, [])
    # In one call the cascade continues into the newly exposed parent before the newer [9] leaf.
    insert_fresh(tree, [1, 2, 5])
    tree.match([9])
    assert tree.evict(3) == 3
    assert tree.match([9]).cached_len == 1 and tree.total_pages == 1
    check_structure(tree, [])


def test_reset_frees_everything_and_refuses_while_locked(make_tree) -> None:
    tree = make_tree(2, num_pages=10)
    insert_fresh(tree, seq(6))
    h = insert_fresh(tree, seq(4) + [7, 7, 8, 8]).handle
    tree.lock(h)
    with pytest.raises(RuntimeError):
        tree.reset()
    tree.unlock(h)
    tree.reset()
    assert tree.total_pages == 0 and tree.num_nodes == 0 and tree.allocator.num_free == 10
    assert tree.match(seq(6)).cached_len == 0
    with pytest.raises(ValueError, match="no longer in the tree"):
        tree.lock(h)
    check_structure(tree, [])
