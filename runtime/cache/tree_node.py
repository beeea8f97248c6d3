"""A node of the page radix tree (``runtime/cache/radix_tree.py`` has the picture): a run of whole pages,
its children, its locks, and the fields an eviction policy reads.  Its own module, so the policies can
name it without importing the tree that uses them."""

from __future__ import annotations

from collections.abc import Hashable

from kvreuse.runtime.cache.node_states import NodeState


class TreeNode:
    """One edge of the radix tree: a run of whole pages and the tokens they hold."""

    __slots__ = ("key", "pages", "children", "parent", "ref", "pin", "last_access", "uid", "ns", "extra")

    def __init__(
        self, key: tuple[int, ...], pages: list[int], parent: TreeNode | None, uid: int, ns: Hashable = None
    ) -> None:
        self.key = key
        self.pages = pages
        self.ns = ns  # the namespace (tenant) it belongs to; children are keyed by (ns, first page)
        self.children: dict[tuple, TreeNode] = {}
        self.parent = parent
        self.ref = 0
        self.pin = 0  # how many of ``ref`` are pins (never more)
        self.last_access = 0
        self.uid = uid
        self.extra: NodeState | None = None  # the state after this node's prefix (see NodeStates)

    def __repr__(self) -> str:
        return f"TreeNode(uid={self.uid}, tokens={len(self.key)}, pages={self.pages}, ref={self.ref})"
