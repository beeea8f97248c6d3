"""The eviction policy interface (``runtime/cache/eviction.py`` explains the hooks and lists the policies)
and the per-node state the stateful policies share; its own module so that policies outside
``eviction.py`` (``hazard.py``) extend it without importing the registry that names them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvreuse.runtime.cache.tree_node import TreeNode


class EvictionPolicy:
    """Base policy: hooks do nothing, no second chances; subclasses define ``priority``."""

    name = "base"
    trim = True  # evict only the tail pages needed from the last victim, not the whole leaf

    def added(self, node: TreeNode, now: int) -> None:
        """``node`` was just inserted as a new leaf."""

    def used(self, node: TreeNode, now: int) -> None:
        """A request reached ``node`` while nothing held it (see the module docstring)."""

    def split(self, upper: TreeNode, lower: TreeNode) -> None:
        """``lower`` (the old node) was cut; ``upper`` is its new first part and inherits its state."""

    def removed(self, node: TreeNode) -> None:
        """``node`` left the tree (evicted or reset)."""

    def finished(self, node: TreeNode, num_prompt: int, num_output: int) -> None:
        """A request whose cached prefix ends at ``node`` ended with that many prompt and output tokens."""

    def priority(self, node: TreeNode, now: int) -> tuple:
        raise NotImplementedError

    def state_priority(self, node: TreeNode, now: int) -> tuple:
        """``priority`` in a tree whose nodes resume only where a state is (window and hybrid models,
        ``NodeStates``): a leaf's pages are worth what its state is, so both give way in this order.
        The same as ``priority`` unless a policy says otherwise."""
        return self.priority(node, now)

    def spare(self, node: TreeNode) -> bool:
        return False

    def check(self, tree_pages: int) -> None:
        """Assert the policy's own page counts agree with the tree's (tests)."""

    def predictor(self) -> dict | None:
        """A learned order's figures (``predict``: return rates of kept and evicted nodes, calibration);
        ``None`` for a policy that learns nothing to show."""
        return None


class PerNode(EvictionPolicy):
    """A policy with one state object per node, copied on split and dropped on removal."""

    def __init__(self) -> None:
        self.state: dict[TreeNode, list] = {}

    def split(self, upper: TreeNode, lower: TreeNode) -> None:
        if lower in self.state:
            self.state[upper] = list(self.state[lower])

    def removed(self, node: TreeNode) -> None:
        self.state.pop(node, None)
