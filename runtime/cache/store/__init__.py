"""Lower tiers under the radix tree: host memory and disk, keyed by page-prefix chains."""

from kvreuse.runtime.cache.store.disk import DiskStore, PageRecord, StoreError, StoreStats
from kvreuse.runtime.cache.store.fingerprint import fingerprint
from kvreuse.runtime.cache.store.host import HostStore
from kvreuse.runtime.cache.store.page_keys import page_key, page_keys, root_key

__all__ = [
    "DiskStore",
    "HostStore",
    "PageRecord",
    "StoreError",
    "StoreStats",
    "fingerprint",
    "page_key",
    "page_keys",
    "root_key",
]
