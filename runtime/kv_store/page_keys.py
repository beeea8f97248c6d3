"""Content keys of KV pages: a page is named by the whole token prefix it ends.

The K/V of page ``i`` depends on every token before it, so its key chains the previous page's key
with this page's tokens (as vLLM's block hashes do)::

    tokens : | t0 .. t15 | t16 .. t31 | t32 .. t47 |        (page_size 16)
    keys   :   k0 = H(root, p0)  k1 = H(k0, p1)  k2 = H(k1, p2)

Two prompts share a key exactly when they share the prefix up to that page's end, so a lower
tier keyed this way is a tree too (each record names its parent key) and survives a restart
without the in-memory radix tree.  The root key includes a namespace (a tenant salt, say), so
equal tokens in two namespaces never share a key.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

KEY_BYTES = 16


def root_key(namespace: str = "") -> bytes:
    """The key every chain starts from."""
    return hashlib.blake2b(b"kvreuse-root\0" + namespace.encode(), digest_size=KEY_BYTES).digest()


def page_key(parent: bytes, page_tokens: Sequence[int]) -> bytes:
    """Key of a page of ``page_tokens`` following the page keyed ``parent``."""
    return hashlib.blake2b(parent + array("q", page_tokens).tobytes(), digest_size=KEY_BYTES).digest()


def page_keys(
    tokens: Sequence[int], page_size: int, parent: bytes | None = None, start: int = 0
) -> list[bytes]:
    """Keys of the whole pages of ``tokens[start:]``; ``parent`` is the key of the page ending at ``start``."""
    if start % page_size:
        raise ValueError(f"start {start} is not page-aligned (page_size {page_size})")
    key = root_key() if parent is None else parent
    out = []
    for s in range(start, len(tokens) - page_size + 1, page_size):
        key = page_key(key, tokens[s : s + page_size])
        out.append(key)
    return out
