"""Who a request's cache belongs to: its tenant's namespace, the public prefix, its session.

The server derives all of it (from the API key and the request); a client never names a
namespace.  In the radix tree a namespace is part of every child key, so a request can only
match prefixes computed under its own namespace, except for its first ``public_len`` tokens
(page-aligned down), which are matched and stored in the shared public namespace (``None``):
a system prompt every tenant sends can be computed once without letting one tenant probe
another's history.  Without tenants everything lives in the public namespace.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple


class CacheScope(NamedTuple):
    """``namespace``: the tenant (``None``: public); ``public_len``: leading tokens shared publicly;
    ``session``: the pin owner whose last node stays cached (``runtime/cache/pins.py``)."""

    namespace: Hashable | None = None
    public_len: int = 0
    session: Hashable | None = None


PUBLIC = CacheScope()
