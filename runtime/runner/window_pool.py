"""The KV of sliding-window layers: a ring of pages per running request, not pages per token.

A window layer's query at position p reads only keys (p - W, p], so a request needs at most the last
``W - 1 + chunk`` keys of a window layer at any step.  Each request's slot owns ``ring_pages`` pages
of every window layer, and token position ``t`` lives in ring page ``(t // page_size) % ring_pages``::

    positions   0    4    8    12   16   20   24   28          (page_size 4, ring_pages 4)
    logical pg  0    1    2    3    4    5    6    7
    ring page   0    1    2    3    0    1    2    3     <- pages 4..7 overwrite 0..3
    step: keys 13..27 (W = 9, chunk 20..27)    [ 3 | 0 | 1 | 2 | 3 ]  spans 5 logical pages,
    so ring_pages = ceil((W + chunk) / page_size) + 1 always covers the band a step reads.

The kernels read a window layer through a page table whose row for the slot maps logical page j to
``slot * ring_pages + j % ring_pages`` (``ring_batch``) and read only each query's band, so pages
that left every window are simply overwritten: a window layer costs ``slots * ring_pages`` pages
however long the context.  The full-attention layers keep their pages in ``KVPool``.

The prefix cache cannot keep a ring, so it keeps ``WindowSnapshot``s: every window layer's last
``W`` keys before a page boundary, taken where ``runtime/cache/state_slots.py`` takes a hybrid's
state snapshots and restored into a request's ring when its match ends there.  Same interface as
``StatePool`` (``model_state.ModelState``), so the cache manager and scheduler run one code path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from kvreuse.runtime.runner.model_state import KVLayers, ModelState, StateInput

if TYPE_CHECKING:
    from kvreuse.kernels.backends import AttentionBackend
    from kvreuse.runtime.models.batch import ForwardBatch
    from kvreuse.runtime.models.config import ModelConfig


class WindowSnapshot(NamedTuple):
    """Every window layer's keys and values at the ``span`` positions before a boundary ``n``:
    ``kv [layers, 2, span, kv_heads, head_dim]``, position ``n - span + j`` at index j (garbage below 0)."""

    kv: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes


class SplicedSnapshot(NamedTuple):
    """The window before a point m made of snapshots taken elsewhere: ``parts`` ``(n, snapshot)``, each
    holding positions ``[n - span, n)`` (None: the empty prefix at 0), together covering ``[m - span,
    m)``.  Any snapshot on a path through m holds the same keys below m: they depend on those tokens only."""

    parts: tuple[tuple[int, WindowSnapshot | None], ...]


class WindowPool(ModelState):
    """``layers[i]``: window layer i's ring buffers ``[slots * ring_pages, page_size, kv_heads, head_dim]``.

    The prefix cache keeps its snapshots, which splice (``splice_span``) and go to the host and disk
    tiers within ``snapshot_store_share`` of the store (not the shared store yet); a ring has no
    rollback for a rejected draft; the rings come out of the KV budget; a chunk longer than the one
    the rings were built for would overwrite keys its own queries still read."""

    keeps_snapshots = True
    rolls_back = False
    # Of --kv-store-size, what the snapshot files may hold; the pages get the rest, so the folder as a
    # whole stays within the size asked for.  A snapshot is a window's K/V of the local layers, about
    # as large as the window's pages of those layers, and one is kept per prefix end rather than per
    # page, so a quarter leaves the pages most of the room.
    snapshot_store_share = 0.25

    def __init__(
        self,
        cfg: ModelConfig,
        num_slots: int,
        page_size: int,
        chunk_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        windows = [cfg.windows[i] for i in cfg.cache_layers if cfg.windows[i] is not None]
        self.page_size = page_size
        self.span = max(windows)  # a snapshot keeps the widest window's keys for every window layer
        self.max_chunk = chunk_size
        self.ring_pages = -(-(self.span + chunk_size) // page_size) + 1
        self.num_slots = num_slots
        shape = (num_slots * self.ring_pages, page_size, *cfg.kv_shape(window=True))
        self.layers = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in windows
        ]
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def splice_span(self) -> int:
        """How many positions before its end a snapshot holds: two snapshots within this of each other
        hold the window before any point between them (``SplicedSnapshot``)."""
        return self.span

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)

    def kv_budget_left(self, kv_cache_memory: int) -> int:
        if self.nbytes >= kv_cache_memory:
            raise ValueError(
                f"KV budget too small: the window rings of {self.num_slots} running requests (--max-running)"
                f" take {self.nbytes / 2**20:.0f} MiB of the {kv_cache_memory / 2**20:.0f} MiB"
                " (--kv-cache-memory); lower --max-running or raise --kv-cache-memory"
            )
        return kv_cache_memory - self.nbytes

    def full_layers(self, cfg: ModelConfig) -> int:
        return sum(cfg.window(i) is None for i in cfg.cache_layers)

    def kv_layers(self, cfg: ModelConfig, pool_layers: KVLayers) -> KVLayers:
        full, ring = iter(pool_layers), iter(self.layers)
        own = {i: next(ring) if cfg.window(i) is not None else next(full) for i in cfg.cache_layers}
        return [own[src] for src in cfg.kv_source]

    def chunk_limit(self, tokens: int) -> int:
        return min(tokens, self.max_chunk)

    def keeps_on_tiers(self, shared: bool) -> bool:
        return not shared

    def run(
        self, model: torch.nn.Module, fb: ForwardBatch, kv_layers: KVLayers, backend: AttentionBackend,
        states: StateInput | None,
    ) -> torch.Tensor:  # fmt: skip
        """Forward with the window layers on the sequences' rings; then fill the window snapshots the
        step asked for (every snapshot lies within its chunk, still in the ring)."""
        assert states is not None, "a window model's step needs its ring slots"
        cu = fb.cu_seqlens_q.tolist()
        longest = max(b - a for a, b in zip(cu, cu[1:]))
        if longest > self.max_chunk:
            raise ValueError(
                f"a {longest}-token chunk overflows the window rings (built for {self.max_chunk})"
            )
        ring = ring_batch(fb, states.slots, self.ring_pages, self.page_size)
        logits = model(fb, kv_layers, backend, ring)
        starts = fb.positions[fb.cu_seqlens_q[:-1].long()].tolist() if cu[-1] else []
        inside = iter(states.inside)
        for i, (slot, cuts, end) in enumerate(zip(states.slots, states.cuts, states.ends)):
            for off in cuts:
                self.copy_to(slot, next(inside), starts[i] + off)
            if end is not None:
                self.copy_to(slot, end, starts[i] + cu[i + 1] - cu[i])
        return logits

    @property
    def snapshot_bytes(self) -> int:
        k = self.layers[0][0]
        return 2 * len(self.layers) * self.span * k[0, 0].numel() * k.element_size()

    def alloc(self) -> int:
        if not self._free:
            raise RuntimeError(f"all {self.num_slots} window-ring slots are in use")
        return self._free.pop()

    def free(self, slot: int) -> None:
        self._free.append(slot)

    def slots_of(self, slot: int, start: int, end: int) -> torch.Tensor:
        """Ring slot (page * page_size + offset) of each position in ``[start, end)`` (clamped at 0)."""
        pos = torch.arange(start, end, device=self.layers[0][0].device).clamp(min=0)
        ps = self.page_size
        return (slot * self.ring_pages + (pos // ps) % self.ring_pages) * ps + pos % ps

    def empty_snapshot(self) -> WindowSnapshot:
        k = self.layers[0][0]
        return WindowSnapshot(k.new_empty(len(self.layers), 2, self.span, *k.shape[2:]))

    def snapshot_to_host(self, snap: WindowSnapshot) -> torch.Tensor:
        """A snapshot's K/V as a host tensor (what the host and disk tiers keep)."""
        return snap.kv.to("cpu")

    def snapshot_from_host(self, kv: torch.Tensor) -> WindowSnapshot:
        """A snapshot back from the tiers, on this pool's device and dtype (checked against its shape)."""
        k = self.layers[0][0]
        want = (len(self.layers), 2, self.span, *k.shape[2:])
        if tuple(kv.shape) != want:
            raise ValueError(f"stored window snapshot has shape {tuple(kv.shape)}, this model's is {want}")
        return WindowSnapshot(kv.to(k.device, k.dtype))

    def copy_to(self, slot: int, snap: WindowSnapshot, end: int) -> None:
        """Fill ``snap`` with the ring's keys before position ``end`` (still in the ring: a step's
        snapshots lie within its chunk, and the ring holds W + chunk positions)."""
        idx = self.slots_of(slot, end - self.span, end)
        for i, (k, v) in enumerate(self.layers):
            snap.kv[i, 0].copy_(k.view(-1, *k.shape[2:]).index_select(0, idx))
            snap.kv[i, 1].copy_(v.view(-1, *v.shape[2:]).index_select(0, idx))

    def restore(self, slot: int, snap: WindowSnapshot | SplicedSnapshot, end: int) -> None:
        """Put a snapshot taken at ``end`` (or the parts of a spliced one) back into ``slot``'s ring:
        its request resumes at ``end``."""
        parts = snap.parts if isinstance(snap, SplicedSnapshot) else ((end, snap),)
        first = max(0, end - self.span)
        for n, part in parts:
            lo, hi = max(first, n - self.span), min(n, end)
            if part is None or lo >= hi:
                continue
            assert n >= end or n - self.span <= first, (
                "a snapshot below the resume point misses part of its window"
            )
            idx = self.slots_of(slot, lo, hi)
            kv = part.kv[:, :, lo - n + self.span : hi - n + self.span]
            for i, (k, v) in enumerate(self.layers):
                k.view(-1, *k.shape[2:]).index_copy_(0, idx, kv[i, 0])
                v.view(-1, *v.shape[2:]).index_copy_(0, idx, kv[i, 1])


def ring_batch(fb: ForwardBatch, slots: list[int], ring_pages: int, page_size: int) -> ForwardBatch:
    """``fb`` re-addressed for the window layers: each sequence's logical pages map into its slot's ring."""
    dev = fb.page_table.device
    base = torch.tensor(slots, dtype=torch.long, device=dev) * ring_pages
    cols = torch.arange(fb.page_table.shape[1], device=dev) % ring_pages
    table = (base[:, None] + cols[None, :]).to(torch.int32)
    seq = torch.repeat_interleave(
        torch.arange(len(slots), device=dev), (fb.cu_seqlens_q[1:] - fb.cu_seqlens_q[:-1]).long()
    )
    pos = fb.positions
    slot_mapping = (base[seq] + (pos // page_size) % ring_pages) * page_size + pos % page_size
    return fb._replace(page_table=table, slot_mapping=slot_mapping)
