"""Write and read throughput of the shared tier's Valkey store and the disk tier, side by side.

Pages of a model's real shape (``[layers, 2, page_size, kv_heads, head_dim]``), random values,
written in groups of ``group`` consecutive pages (one pipelined round trip to Valkey, one group file
on disk) and read back the same way; every read is checked against what was written.  Part of
``benchmarks/cluster/replicas.py``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from kvreuse.runtime.cache.store.disk import DiskStore
from kvreuse.runtime.cache.store.page_keys import page_keys
from kvreuse.runtime.cache.store.shared import SharedStore


def page_shape(model: Path, page_size: int) -> tuple[int, ...]:
    cfg = json.loads((model / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return (cfg["num_hidden_layers"], 2, page_size, cfg.get("num_key_value_heads", heads), head_dim)


def _rates(n_pages: int, page_bytes: int, seconds: float) -> dict:
    return {"seconds": round(seconds, 4), "pages_per_s": round(n_pages / seconds, 1),
            "gb_per_s": round(n_pages * page_bytes / seconds / 1e9, 3)}  # fmt: skip


def measure(store, shape: tuple[int, ...], n_pages: int, group: int, dtype=torch.float32) -> dict:
    """Write then read ``n_pages`` pages through ``store`` (a SharedStore or a DiskStore)."""
    ps = shape[2]
    tokens = list(range(n_pages * ps))
    keys = page_keys(tokens, ps)
    g = torch.Generator().manual_seed(0)
    kv = torch.randn((n_pages, *shape), generator=g).to(dtype)
    page_bytes = kv[0].numel() * kv.element_size()
    toks = [tuple(tokens[i * ps : (i + 1) * ps]) for i in range(n_pages)]
    t0 = time.perf_counter()
    for i in range(0, n_pages, group):
        parent = keys[i - 1] if i else b"\0" * 16
        store.put(parent, i == 0, keys[i : i + group], toks[i : i + group], kv[i : i + group])
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = []
    for i in range(0, n_pages, group):
        part = store.get(keys[i : i + group])
        got.append(torch.stack(part[0]) if isinstance(part, tuple) else part)
    read_s = time.perf_counter() - t0
    assert torch.equal(torch.cat(got), kv), "a page read back differs from the one written"
    return {"pages": n_pages, "page_bytes": page_bytes, "group": group,
            "write": _rates(n_pages, page_bytes, write_s), "read": _rates(n_pages, page_bytes, read_s)}  # fmt: skip


def compare(url: str, workdir: Path, model: Path, n_pages: int, group: int = 16) -> dict:
    shape = page_shape(model, 16)
    shared = SharedStore(url, "00" * 20)
    shared.clear()
    valkey = measure(shared, shape, n_pages, group)
    shared.clear()
    shared.close()
    disk_store = DiskStore(workdir / "disk-tier", "00" * 20, 1 << 40)
    try:
        disk = measure(disk_store, shape, n_pages, group)
    finally:
        disk_store.close()
    return {"page_shape": list(shape), "dtype": "float32", "valkey": valkey, "disk": disk,
            "valkey_over_disk": {k: round(valkey[k]["gb_per_s"] / disk[k]["gb_per_s"], 3) for k in ("write", "read")}}  # fmt: skip
