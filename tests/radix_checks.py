"""Checks shared by the radix cache tests: everything re-derived by walking the tree's public nodes."""

from __future__ import annotations

from kvreuse.runtime.cache.radix_cache import InsertResult, RadixCache, TreeNode


def tree_pages(tree: RadixCache) -> dict[tuple[int, ...], int]:
    """Every page-aligned prefix stored in the tree -> the page holding its last page of tokens."""
    out: dict[tuple[int, ...], int] = {}
    stack = [(tree.root, ())]
    while stack:
        node, prefix = stack.pop()
        for i, page in enumerate(node.pages):
            out[prefix + node.key[: (i + 1) * tree.page_size]] = page
        stack.extend((child, prefix + node.key) for child in node.children.values())
    return out


def node_ends(tree: RadixCache) -> dict[tuple[int, ...], tuple[int, ...]]:
    """Every page-aligned prefix stored in the tree -> the tokens up to the end of the node holding it."""
    out: dict[tuple[int, ...], tuple[int, ...]] = {}
    stack = [(tree.root, ())]
    while stack:
        node, prefix = stack.pop()
        for i in range(len(node.pages)):
            out[prefix + node.key[: (i + 1) * tree.page_size]] = prefix + node.key
        stack.extend((child, prefix + node.key) for child in node.children.values())
    return out


def tree_states(tree: RadixCache) -> dict[tuple[int, ...], object]:
    """Every prefix whose node holds an extra state -> that state."""
    out: dict[tuple[int, ...], object] = {}
    stack = [(tree.root, ())]
    while stack:
        node, prefix = stack.pop()
        if node.extra is not None:
            out[prefix + node.key] = node.extra
        stack.extend((child, prefix + node.key) for child in node.children.values())
    return out


def path_tokens(handle: TreeNode) -> tuple[int, ...]:
    parts = []
    node: TreeNode | None = handle
    while node is not None:
        parts.append(node.key)
        node = node.parent
    return tuple(t for key in reversed(parts) for t in key)


def check_structure(tree: RadixCache, locked_handles: list[TreeNode], held: int = 0) -> None:
    """Shape, ref counts, counters, the evictable-leaf set and page conservation, all re-derived here."""
    ps, nodes = tree.page_size, []
    stack = list(tree.root.children.values())
    while stack:
        node = stack.pop()
        nodes.append(node)
        assert len(node.pages) >= 1 and len(node.key) == len(node.pages) * ps
        assert node.parent is not None and node.parent.children[(node.ns, node.key[:ps])] is node
        own = sum(h is node for h in locked_handles)
        assert node.ref == own + sum(c.ref for c in node.children.values())
        stack.extend(node.children.values())
    assert tree.num_nodes == len(nodes)
    assert tree.total_pages == sum(len(n.pages) for n in nodes)
    assert tree.locked_pages == sum(len(n.pages) for n in nodes if n.ref > 0)
    assert tree.evictable_pages == tree.total_pages - tree.locked_pages
    assert all(c.pin <= n.pin <= n.ref for n in nodes for c in n.children.values()) and all(
        n.pin <= n.ref for n in nodes
    )
    assert tree.pinned_pages == sum(len(n.pages) for n in nodes if n.pin > 0)
    assert set(tree._evictable) == {n for n in nodes if n.ref == 0 and not n.children}
    assert tree.allocator.num_free + tree.total_pages + held == tree.allocator.num_pages
    assert all(not tree.allocator.is_free(p) for n in nodes for p in n.pages)
    # node states: only with a store, never on the root; the store's count and bytes re-derived
    held = [n.extra for n in nodes if n.extra is not None]
    assert tree.root.extra is None
    if tree.states is None:
        assert not held
    else:
        st = tree.stats()
        assert (st.states, st.state_bytes) == (len(held), sum(x.nbytes for x in held))
        assert st.state_bytes <= tree.states.budget_bytes
        tree.check()


def seq(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def insert_fresh(tree: RadixCache, tokens: list[int]) -> InsertResult:
    """Insert as a request that computed all its KV itself: fresh pages, duplicates freed afterwards."""
    pages = tree.allocator.alloc(len(tokens) // tree.page_size)
    res = tree.insert(tokens, pages)
    tree.allocator.free(pages[: res.prefix_len // tree.page_size])
    return res
