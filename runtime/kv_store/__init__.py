"""Lower tiers under the radix tree: host memory and disk, keyed by page-prefix chains."""

from runtime.kv_store.disk import DiskStore, PageRecord, StoreError, StoreStats
from runtime.kv_store.fingerprint import fingerprint
from runtime.kv_store.host import HostStore
from runtime.kv_store.page_keys import page_key, page_keys, root_key

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
