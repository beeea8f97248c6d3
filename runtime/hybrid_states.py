"""A hybrid model's linear-attention states beside the KV pages: slots for running requests, snapshots for reuse.

Where snapshots are taken (always at page boundaries, where the tree's KV pages end):

* the last page boundary of every prefill chunk: the end of the prompt (where the next turn of a
  conversation continues) and chunk ends on long prompts;
* every ``every_pages`` pages inside a chunk (0: off);
* the last page boundary a request reached when it ends or is retracted: the end of its output.
  During decode the state at each page boundary replaces the request's held one, which is stored
  only when the request leaves (a snapshot per decoded page would flood the budget).

A match is the longest prefix that has both its KV pages in the tree and a snapshot at its end;
the KV match beyond it is cut back and recomputed (``Request.snapshot_cut`` says by how much).
"""

from __future__ import annotations

from runtime.request import Request
from runtime.snapshot_cache import SnapshotCache
from runtime.state_pool import Snapshot, StateInput, StatePool


class HybridStates:
    """State slots (``StatePool``) and snapshots (``SnapshotCache``, None without a prefix cache)."""

    def __init__(
        self, pool: StatePool, page_size: int, snapshots: SnapshotCache | None, every_pages: int = 0
    ) -> None:
        self.pool = pool
        self.page_size = page_size
        self.snapshots = snapshots
        self.every_pages = every_pages
        self._slots: dict[Request, int] = {}
        self._pending: dict[
            Request, list[tuple[int, Snapshot]]
        ] = {}  # stored once their pages are in the tree
        self._held: dict[Request, tuple[int, Snapshot]] = {}  # latest decode boundary, stored at release

    # -- the cache manager's side ---------------------------------------------------------
    def admit(self, req: Request, tokens: list[int], kv_len: int) -> int:
        """Give ``req`` a slot; restore the longest snapshot within the KV match. Returns the usable length."""
        if req not in self._slots:
            self._slots[req] = self.pool.alloc()
        ns = req.scope.namespace
        n, snap = (0, None) if self.snapshots is None else self.snapshots.lookup(tokens, kv_len, ns)
        if snap is not None:
            self.pool.restore(self._slots[req], snap)
        req.snapshot_cut = kv_len - n
        return n

    def match_len(self, tokens: list[int], kv_len: int, namespace=None) -> int:
        return 0 if self.snapshots is None else self.snapshots.lookup(tokens, kv_len, namespace)[0]

    def inserted(self, req: Request, tree_len: int) -> None:
        """The tree now holds ``req``'s first ``tree_len`` tokens: store the pending snapshots within them."""
        keep = []
        for n, snap in self._pending.pop(req, []):
            if n <= tree_len:
                self._store(req, n, snap)
            else:
                keep.append((n, snap))
        if keep:
            self._pending[req] = keep

    def release(self, req: Request, tree_len: int) -> None:
        """The request leaves (finished, aborted or retracted) with its first ``tree_len`` tokens in the tree."""
        self.inserted(req, tree_len)
        held = self._held.pop(req, None)
        if held is not None and held[0] <= tree_len:
            self._store(req, held[0], held[1])
        self._pending.pop(req, None)
        slot = self._slots.pop(req, None)
        if slot is not None:
            self.pool.free(slot)

    def prune(self, cached_len) -> None:
        """After the prefix cache evicted: drop the snapshots whose prefix lost its KV pages."""
        if self.snapshots is not None:
            self.snapshots.prune(cached_len)

    def reset(self) -> None:
        if self.snapshots is not None:
            self.snapshots.reset()

    def _store(self, req: Request, n: int, snap: Snapshot) -> None:
        if self.snapshots is not None and n > 0:
            self.snapshots.put(req.tokens[:n], snap, req.scope.namespace, req.scope.public_len)

    def slot(self, req: Request) -> int:
        return self._slots[req]

    # -- a step's states ---------------------------------------------------------------------
    def step_input(self, chunks: list[tuple[Request, int, int]]) -> StateInput:
        """The runner's view of a step's ``(request, start, length)`` chunks: slots, and empty snapshots
        for the states the policy keeps (filled by the forward; pending or held from now on)."""
        pool = self.pool
        cuts, inside, ends = [], [], []
        for req, start, length in chunks:
            decode = length == 1 and start >= req.num_prompt
            cut, at_end = self._cuts(start, length, decode)
            cuts.append(cut)
            for off in cut:
                inside.append(snap := pool.empty_snapshot())
                self._captured(req, start + off, snap, decode)
            ends.append(snap := pool.empty_snapshot() if at_end else None)
            if snap is not None:
                self._captured(req, start + length, snap, decode)
        return StateInput(
            [self._slots[r] for r, _, _ in chunks], [s == 0 for _, s, _ in chunks], cuts, inside, ends
        )

    def _cuts(self, start: int, length: int, decode: bool) -> tuple[list[int], bool]:
        """Offsets inside a chunk whose states to capture, and whether to capture its end state too."""
        if self.snapshots is None:
            return [], False
        ps, end = self.page_size, start + length
        if decode:
            return [], end % ps == 0
        last = end - end % ps
        every = self.every_pages * ps
        points = {n for n in range(start - start % ps + ps, end + 1, ps) if every and n % every == 0}
        if last > start:
            points.add(last)
        inside = sorted(n - start for n in points if n < end)
        return inside, end in points

    def _captured(self, req: Request, n: int, snap: Snapshot, decode: bool) -> None:
        """The state after ``req.tokens[:n]``: held (decode) or pending until its pages are in the tree."""
        if not decode:
            self._pending.setdefault(req, []).append((n, snap))
        self._held[req] = (n, snap)

    # -- accounting --------------------------------------------------------------------------
    def check(self, live: set[Request], cached_len) -> None:
        if set(self._slots) - live:
            raise AssertionError("a state slot outlived its request")
        if len(set(self._slots.values())) + self.pool.num_free != self.pool.num_slots:
            raise AssertionError(f"state slot leak: {len(self._slots)} used, {self.pool.num_free} free")
        if self.snapshots is not None:
            self.snapshots.check(cached_len)
