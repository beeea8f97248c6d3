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
from collections.abc import Hashable, Sequence

KEY_BYTES = 16


def root_key(namespace: str = "") -> bytes:
    """The key every chain starts from."""
    return hashlib.blake2b(b"kvreuse-root\0" + namespace.encode(), digest_size=KEY_BYTES).digest()


def _ns_bytes(namespace: Hashable) -> bytes:
    return b"\0" if namespace is None else b"\1" + str(namespace).encode() + b"\0"


def page_key(parent: bytes, page_tokens: Sequence[int], namespace: Hashable = None) -> bytes:
    """Key of a page of ``page_tokens`` following the page keyed ``parent``, stored under ``namespace``
    (a tenant; None: public), so equal tokens of two tenants never share a key."""
    blob = parent + _ns_bytes(namespace) + array("q", page_tokens).tobytes()
    return hashlib.blake2b(blob, digest_size=KEY_BYTES).digest()


def page_keys(
    tokens: Sequence[int],
    page_size: int,
    parent: bytes | None = None,
    start: int = 0,
    namespaces: Sequence[Hashable] | None = None,
) -> list[bytes]:
    """Keys of the whole pages of ``tokens[start:]``; ``parent`` is the key of the page ending at ``start``;
    ``namespaces[i]`` is the namespace of the i-th of those pages (default: all public)."""
    if start % page_size:
        raise ValueError(f"start {start} is not page-aligned (page_size {page_size})")
    key = root_key() if parent is None else parent
    out = []
    for i, s in enumerate(range(start, len(tokens) - page_size + 1, page_size)):
        key = page_key(key, tokens[s : s + page_size], None if namespaces is None else namespaces[i])
        out.append(key)
    return out


def scope_namespaces(n_pages: int, page_size: int, namespace: Hashable, public_len: int) -> list[Hashable]:
    """Per page, the namespace a request's page lives in: public for its first ``public_len`` tokens
    (page-aligned down) when it has a tenant, its tenant's after (``runtime/request.py``)."""
    boundary = public_len // page_size
    return [None if namespace is not None and i < boundary else namespace for i in range(n_pages)]
