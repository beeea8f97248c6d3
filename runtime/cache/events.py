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
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from kvreuse.runtime.cache.tree_node import TreeNode

ROOT_HASH = 0  # the empty prefix; a stored run whose parent it is has no parent block


class CacheEvents:
    """The radix cache's event hook; this one ignores everything (nobody subscribed)."""

    def stored(self, node: TreeNode) -> None:
        """``node`` (attached, its pages new to the cache) was added."""

    def removed(self, node: TreeNode) -> None:
        """``node`` is about to be evicted (still attached); its pages leave the cache."""

    def cleared(self) -> None:
        """Every page left the cache (a reset)."""


class EventSource(Protocol):
    """What a listener needs of a cache (``CacheManager``, or a ``PrefixCache`` itself)."""

    def listen(self, events: CacheEvents) -> bool:
        """Make ``events`` the hook; False when the cache stores nothing to tell of."""
        ...

    def announce(self, events: CacheEvents) -> None:
        """Tell ``events`` every node held now, parents first, as stored."""
        ...


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
    """Turns the cache's node events into page events for ``sink`` (see the module docstring).

    The hash of each node's last page is kept by node uid, so a store costs the node's own pages, not
    its whole prefix's: a node keeps its uid and its last page's prefix through a split (the upper
    half is a new node), so an entry stays right until the node is evicted or the cache reset.
    """

    def __init__(self, page_size: int, sink: Callable[[Event], None]) -> None:
        self.page_size, self.sink = page_size, sink
        self._tails: dict[int, int] = {}  # node uid -> the chained hash of its last page

    def _page_hashes(self, node: TreeNode, parent_hash: int) -> list[int]:
        hashes, h, ps = [], parent_hash, self.page_size
        for i in range(len(node.pages)):
            h = block_hash(h, node.ns, node.key[i * ps : (i + 1) * ps])
            hashes.append(h)
        return hashes

    def _tail(self, node: TreeNode | None) -> int:
        """The chained hash of the last page of ``node``'s prefix (``ROOT_HASH`` for the root)."""
        path = []
        while node is not None and node.parent is not None and node.uid not in self._tails:
            path.append(node)
            node = node.parent
        h = ROOT_HASH if node is None or node.parent is None else self._tails[node.uid]
        for n in reversed(path):
            h = self._page_hashes(n, h)[-1]
            self._tails[n.uid] = h
        return h

    def stored(self, node: TreeNode) -> None:
        parent = self._tail(node.parent)
        hashes, ps = self._page_hashes(node, parent), self.page_size
        self._tails[node.uid] = hashes[-1]
        blocks = [Block(h, tuple(node.key[i * ps : (i + 1) * ps])) for i, h in enumerate(hashes)]
        self.sink(Stored(parent, blocks, node.ns))

    def removed(self, node: TreeNode) -> None:
        hashes = self._page_hashes(node, self._tail(node.parent))
        self._tails.pop(node.uid, None)
        self.sink(Removed(hashes))

    def cleared(self) -> None:
        self._tails.clear()
        self.sink(Cleared())
