"""Open the lower tiers an engine was configured with (the one place that knows the flags)."""

from __future__ import annotations

import logging
from pathlib import Path

from kvreuse.runtime.cache.store.disk import DiskStore
from kvreuse.runtime.cache.store.fingerprint import fingerprint
from kvreuse.runtime.cache.store.host import HostStore
from kvreuse.runtime.cache.store.shared import SharedStore, public_url
from kvreuse.runtime.cache.store.shared_tier import SharedTier
from kvreuse.runtime.cache.store.tiers import LowerTiers

log = logging.getLogger("kvreuse.store")


def open_tiers(
    store_dir: str | None,
    store_bytes: int,
    host_bytes: int | None,
    model_dir: Path,
    dtype: str,
    page_size: int,
    pin: bool,
    memo_dir: Path | None = None,
    settings: dict | None = None,
    shared_url: str | None = None,
    shared_secret: bytes | None = None,
) -> LowerTiers | None:
    """The configured tiers, or None when no store, host budget or shared store is set.  ``settings``:
    the engine options that change the K/V (they go into the stores' fingerprint).  A shared store
    that cannot be reached now is not an error: the tier starts degraded and retries.

    Raises :class:`kvreuse.runtime.cache.store.disk.StoreError` for a store of another model or in use.
    """
    if not store_dir and not host_bytes and not shared_url:
        return None
    fp = fingerprint(model_dir, dtype, page_size, memo_dir, settings)
    disk = DiskStore(store_dir, fp, store_bytes) if store_dir else None
    host = HostStore(host_bytes, pin=pin) if host_bytes else None
    shared = None
    if shared_url:
        if shared_secret is None:
            log.warning("shared KV store %s: entries carry a checksum, not an HMAC (--kv-shared-secret-file); "
                        "any client of the store can write pages this replica serves", public_url(shared_url))  # fmt: skip
        shared = SharedTier(SharedStore(shared_url, fp, secret=shared_secret))
    return LowerTiers(host, disk, shared=shared)
