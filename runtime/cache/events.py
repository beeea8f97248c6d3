"""KV cache events: the pages that enter and leave the prefix cache, told to whoever listens.

A gateway that routes by cache content (SMG's event-driven index, ``runtime/server/grpc/``) needs
to know which prefixes each replica holds, page by page, as they come and go.  The radix cache
(``runtime/cache/radix_cache.py``) calls its ``events`` hook with each node it adds (``stored``),
each node it is about to evict, still attached (``removed``), and on a reset (``cleared``).  The
hook is ``CacheEvents``, which does nothing, until a listener replaces it: the cache knows no
server, and a replica nobody subscribes to pays one no-op call per node.

``PageEvents`` is the listener's half: it turns a node into blocks, one per page, each with the
page's tokens and a hash chained over the whole prefix and the node's namespace (the tenant,
``runtime/request.py``), so one page of tokens after two different prefixes, or in two tenants, is
two blocks, and a removal names exactly the hashes its store gave.  It runs on the engine thread,
in the hook, while the node's path is intact; ``sink`` gets plain values to hand on.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from runtime.cache.tree_node import TreeNode

ROOT_HASH = 0  # the empty prefix; a stored run whose parent it is has no parent block


class CacheEvents:
    """The radix cache's event hook; this one ignores everything (nobody subscribed)."""

    def stored(self, node: TreeNode) -> None:
        """``node`` (attached, its pages new to the cache) was added."""

    def removed(self, node: TreeNode) -> None:
        """``node`` is about to be evicted (still attached); its pages leave the cache."""

    def cleared(self) -> None:
        """Every page left the cache (a reset)."""


class Block(NamedTuple):
    """One cached page: its chained hash and its tokens."""

    block_hash: int
    token_ids: tuple[int, ...]


class Stored(NamedTuple):
    """Pages that entered the cache: ``blocks`` follow the block ``parent_hash`` (``ROOT_HASH``: none)."""

    parent_hash: int
    blocks: list[Block]
    namespace: Hashable


class Removed(NamedTuple):
    """Pages that left the cache, by the hashes their ``Stored`` gave."""

    block_hashes: list[int]


class Cleared(NamedTuple):
    """Every page left the cache."""


Event = Stored | Removed | Cleared


def block_hash(parent: int, namespace: Hashable, tokens: tuple[int, ...]) -> int:
    """A page's identity: its tokens after the prefix whose last page hashed to ``parent``, in ``namespace``;
    a signed 64-bit integer (the ``int64`` the gateway's protocol carries)."""
    h = hashlib.blake2b(struct.pack("<q", parent), digest_size=8)
    if namespace is not None:
        h.update(b"ns:" + repr(namespace).encode() + b"\0")
    h.update(struct.pack(f"<{len(tokens)}I", *tokens))
    return struct.unpack("<q", h.digest())[0]


class PageEvents(CacheEvents):
    """Turns the cache's node events into page events for ``sink`` (see the module docstring)."""

    def __init__(self, page_size: int, sink: Callable[[Event], None]) -> None:
        self.page_size, self.sink = page_size, sink

    def _hashes(self, node: TreeNode) -> list[int]:
        """The chained hash of every page from the root to the end of ``node``."""
        path = []
        n: TreeNode | None = node
        while n is not None and n.parent is not None:  # the root holds no pages
            path.append(n)
            n = n.parent
        hashes, h, ps = [], ROOT_HASH, self.page_size
        for n in reversed(path):
            for i in range(len(n.pages)):
                h = block_hash(h, n.ns, n.key[i * ps : (i + 1) * ps])
                hashes.append(h)
        return hashes

    def stored(self, node: TreeNode) -> None:
        hashes, ps = self._hashes(node), self.page_size
        own = hashes[len(hashes) - len(node.pages) :]
        parent = hashes[-len(node.pages) - 1] if len(hashes) > len(node.pages) else ROOT_HASH
        blocks = [Block(h, tuple(node.key[i * ps : (i + 1) * ps])) for i, h in enumerate(own)]
        self.sink(Stored(parent, blocks, node.ns))

    def removed(self, node: TreeNode) -> None:
        self.sink(Removed(self._hashes(node)[-len(node.pages) :]))

    def cleared(self) -> None:
        self.sink(Cleared())
