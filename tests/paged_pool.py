"""A shuffled paged KV pool for kernel tests, poisoned where no query of the step may look."""

from __future__ import annotations

import torch

from kvreuse.kernels import reference


def poisoned_pool(seq_lens: list[int], q_lens: list[int], window: int | None, hkv: int, d: int, page_size: int,
                  gen: torch.Generator):  # fmt: skip
    """``(k_cache, v_cache, page_table, dense)``: each sequence's keys on pages in random order, and its dense
    ``(k, v) [n, hkv, d]`` copies; slots before the first key any of its last ``q_len`` queries sees (the
    window's band) hold NaN, so a kernel that reads them fails (a window layer's ring reuses those pages)."""
    pages = [(n + page_size - 1) // page_size for n in seq_lens]
    total = sum(pages) + 1
    kc = torch.randn(total, page_size, hkv, d, generator=gen)
    vc = torch.randn(total, page_size, hkv, d, generator=gen)
    order = torch.randperm(total, generator=gen).tolist()
    table = torch.zeros(len(seq_lens), max(pages), dtype=torch.int32)
    dense = []
    for i, (n, lq) in enumerate(zip(seq_lens, q_lens)):
        table[i, : pages[i]] = torch.tensor(order[: pages[i]], dtype=torch.int32)
        order = order[pages[i] :]
        slots = reference.kv_slots(table[i], n, page_size)
        dense.append((kc.view(-1, hkv, d)[slots].clone(), vc.view(-1, hkv, d)[slots].clone()))
        lo = 0 if window is None else max(0, n - lq - window + 1)
        kc.view(-1, hkv, d)[slots[:lo]] = float("nan")
        vc.view(-1, hkv, d)[slots[:lo]] = float("nan")
    return kc, vc, table, dense
