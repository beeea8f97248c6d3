"""Open the lower tiers an engine was configured with (the one place that knows the flags)."""

from __future__ import annotations

from pathlib import Path

from runtime.cache.store.disk import DiskStore
from runtime.cache.store.fingerprint import fingerprint
from runtime.cache.store.host import HostStore
from runtime.cache.store.tiers import LowerTiers


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
) -> LowerTiers | None:
    """The configured tiers, or None when neither a store nor a host budget is set.  ``settings``:
    the engine options that change the K/V (they go into the store's fingerprint).

    Raises :class:`runtime.cache.store.disk.StoreError` for a store of another model or in use.
    """
    if not store_dir and not host_bytes:
        return None
    disk = None
    if store_dir:
        disk = DiskStore(store_dir, fingerprint(model_dir, dtype, page_size, memo_dir, settings), store_bytes)
    host = HostStore(host_bytes, pin=pin) if host_bytes else None
    return LowerTiers(host, disk)
