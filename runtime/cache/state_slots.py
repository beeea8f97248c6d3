"""The per-request model state's slots of running requests (a hybrid's linear-attention states or a
window model's rings: ``runtime/runner/model_state.py``), and the snapshots they offer the prefix
cache, which keeps them on its tree nodes (``runtime/cache/node_states.py``).

Where snapshots are taken (always at page boundaries, where the tree's KV pages end):

* the last page boundary of every prefill chunk: the end of the prompt (where the next turn of a
  conversation continues) and chunk ends on long prompts.  A window model's too, although its
  snapshot (W keys of every window layer) is dear: a prompt whose last page boundary is a chunk's
  end (one chunk + a few tokens) has its only resumable point there (issue 50: without it the next
  turn re-prefilled everything);
* every ``every_pages`` pages inside a chunk (0: off);
* where a request's KV match was cut back to an earlier snapshot: the end of that KV match, a
  point where two prompts are known to diverge (a later prompt diverging there resumes from it);
* the last page boundary a request reached when it ends or is retracted: the end of its output.
  During decode the state at each page boundary replaces the request's held one, which is offered
  only when the request leaves (a snapshot per decoded page would flood the budget).  A step that
  verifies a speculative draft takes none when it runs: once the accepted count is known, ``settle``
  rolls the slot back to the last accepted token (``runtime/models/gated_deltanet.py``'s ``replay``)
  and holds the state at the last page boundary up to it, so no snapshot lies past an accepted token.

A match is the longest prefix that has both its KV pages in the tree and a snapshot at its end
(the prefix cache's rule, ``MatchResult.state`` / ``cut_len``); the KV beyond it is recomputed.
``NoStateSlots`` is the same interface for a model whose state the prefix cache keeps no snapshots of
(none at all): no slots, nothing to offer.
"""

from __future__ import annotations

from kvreuse.runtime.models.gated_deltanet import VerifyStash, replay
from kvreuse.runtime.request import Request
from kvreuse.runtime.runner.model_state import ModelState, StateInput
from kvreuse.runtime.runner.state_pool import Snapshot


class NoStateSlots:
    """No state slots to keep (so the cache manager and the scheduler never ask which model runs)."""

    splice_span = None

    def admit(self, req: Request, state: object, kv_len: int) -> None:
        pass

    def take(self, req: Request, upto: int, leaving: bool = False) -> list[tuple[int, Snapshot]]:
        return []

    def release(self, req: Request) -> None:
        pass

    def step_input(
        self, chunks: list[tuple[Request, int, int]], drafted: list[int] | None = None
    ) -> StateInput | None:
        return None

    def settle(self, accepted: dict[Request, int]) -> None:
        pass

    def check(self, live: set[Request]) -> None:
        pass

    def slot(self, req: Request) -> int:
        return 0  # any: the forward of a model without state ignores slots


class StateSlots:
    """Running requests' slots of a ``ModelState`` and the snapshots taken of them for the prefix cache
    (``keep``: it keeps them)."""

    def __init__(self, pool: ModelState, page_size: int, keep: bool, every_pages: int = 0) -> None:
        self.pool = pool
        self.splice_span = pool.splice_span  # a window pool's W: its snapshots splice (RadixCache.match)
        self.page_size = page_size
        self.keep = keep
        self.every_pages = every_pages
        self._slots: dict[Request, int] = {}
        self._pending: dict[Request, list[tuple[int, Snapshot]]] = {}  # offered once their pages are in
        self._held: dict[Request, tuple[int, Snapshot]] = {}  # latest decode boundary, offered at release
        self._forks: dict[Request, int] = {}  # the end of a KV match that was cut back
        # this step's verifying requests: (index among the stash's rows, chunk start, chunk length)
        self._verifying: dict[Request, tuple[int, int, int]] = {}
        self._stash: VerifyStash | None = None

    # -- the cache manager's side ---------------------------------------------------------
    def admit(self, req: Request, state: Snapshot | None, kv_len: int) -> None:
        """Give ``req`` a slot and restore the matched prefix's ``state`` into it (None: start from zero).

        ``kv_len``: how far the KV pages matched; past the state's end it is a divergence point."""
        if req not in self._slots:
            self._slots[req] = self.pool.alloc()
        if state is not None:  # the state after req.tokens[:num_computed] (a window pool needs where)
            self.pool.restore(self._slots[req], state, req.num_computed)
        if kv_len > req.num_computed:
            self._forks[req] = kv_len

    def take(self, req: Request, upto: int, leaving: bool = False) -> list[tuple[int, Snapshot]]:
        """The snapshots for the prefix cache within ``req.tokens[:upto]`` (its pages are being inserted);
        ``leaving``: also the state where its decode stopped."""
        out, keep = [], []
        for n, snap in self._pending.pop(req, []):
            (out if n <= upto else keep).append((n, snap))
        if keep:
            self._pending[req] = keep
        held = self._held.pop(req, None) if leaving else None
        if held is not None and 0 < held[0] <= upto and all(n != held[0] for n, _ in out):
            out.append(held)
        return out

    def release(self, req: Request) -> None:
        """The request leaves (finished, aborted or retracted): its slot and untaken snapshots go."""
        self._pending.pop(req, None)
        self._held.pop(req, None)
        self._forks.pop(req, None)
        self._verifying.pop(req, None)
        slot = self._slots.pop(req, None)
        if slot is not None:
            self.pool.free(slot)

    def slot(self, req: Request) -> int:
        return self._slots[req]

    # -- a step's states ---------------------------------------------------------------------
    def step_input(
        self, chunks: list[tuple[Request, int, int]], drafted: list[int] | None = None
    ) -> StateInput:
        """The runner's view of a step's ``(request, start, length)`` chunks (``drafted[i]``: tokens
        drafted after chunk i, run in the same forward): slots, and empty snapshots for the states the
        policy keeps (filled by the forward; pending or held from now on)."""
        pool = self.pool
        cuts, inside, ends = [], [], []
        self._stash, self._verifying = VerifyStash([], {}), {}
        for i, (req, start, length) in enumerate(chunks):
            if drafted and drafted[i]:  # no snapshot yet: settle() takes it within the accepted part
                self._verifying[req] = (len(self._stash.rows), start, length + drafted[i])
                self._stash.rows.append(i)
                cuts.append([])
                ends.append(None)
                continue
            decode = length == 1 and start >= req.num_prompt
            cut, at_end = self._cuts(start, length, decode, self._forks.get(req, 0))
            cuts.append(cut)
            for off in cut:
                inside.append(snap := pool.empty_snapshot())
                self._captured(req, start + off, snap, decode)
            ends.append(snap := pool.empty_snapshot() if at_end else None)
            if snap is not None:
                self._captured(req, start + length, snap, decode)
        slots, fresh = [self._slots[r] for r, _, _ in chunks], [s == 0 for _, s, _ in chunks]
        return StateInput(slots, fresh, cuts, inside, ends, self._stash if self._stash.rows else None)

    def settle(self, accepted: dict[Request, int]) -> None:
        """After a step that verified drafts: ``accepted[req]`` of each verifying request's drafted
        tokens stand.  Roll its slot back to its last accepted token where a draft was rejected (the
        forward left the state after the whole chunk), and hold the state at the last page boundary
        it reached, as a decode step would."""
        stash, self._stash = self._stash, None  # its tensors are this step's only
        which, lengths, cuts, plan = [], [], [], []
        for req, a in accepted.items():
            j, start, total = self._verifying.pop(req)
            end = start + 1 + a
            n = end - end % self.page_size if self.keep else 0  # the boundary to hold, if reached now
            n = n if n > start else 0
            if end == start + total and n in (0, end):  # nothing rejected, no boundary inside
                if n:
                    self._captured(req, n, self.pool.snapshot(self._slots[req]), True)
                continue
            which.append(j)
            lengths.append(end - start)
            cuts.append([n - start] if 0 < n < end else [])
            plan.append((req, n, end < start + total))
        if not plan:
            return
        assert stash is not None and len(stash.layers) == len(self.pool.layers), (
            "a verify step kept no inputs"
        )
        held = {req: self.pool.empty_snapshot() for req, n, _ in plan if n}
        for layer, inp in stash.layers.items():
            conv, rec, at = replay(inp, which, lengths, cuts)
            caught = iter(at)
            for x, (req, n, rejected) in enumerate(plan):
                if rejected:  # the layer's (conv, rec) slots: views of the pool's tensors
                    self.pool.layers[layer][0][self._slots[req]] = conv[x]
                    self.pool.layers[layer][1][self._slots[req]] = rec[x]
                if n:
                    c, r = next(caught) if cuts[x] else (conv[x], rec[x])
                    held[req].conv[layer].copy_(c)
                    held[req].rec[layer].copy_(r)
        for req, n, _ in plan:
            if n:
                self._captured(req, n, held[req], True)

    def _cuts(self, start: int, length: int, decode: bool, fork: int) -> tuple[list[int], bool]:
        """Offsets inside a chunk whose states to capture (its last page boundary among them), and
        whether to capture its end state too."""
        if not self.keep:
            return [], False
        ps, end = self.page_size, start + length
        if decode:
            return [], end % ps == 0
        last = end - end % ps
        every = self.every_pages * ps
        points = {n for n in range(start - start % ps + ps, end + 1, ps) if every and n % every == 0}
        if last > start:
            points.add(last)
        if start < fork <= end:
            points.add(fork)
        inside = sorted(n - start for n in points if n < end)
        return inside, end in points

    def _captured(self, req: Request, n: int, snap: Snapshot, decode: bool) -> None:
        """The state after ``req.tokens[:n]``: held (decode) or pending until its pages are in the tree."""
        if not decode:
            self._pending.setdefault(req, []).append((n, snap))
        self._held[req] = (n, snap)

    # -- accounting --------------------------------------------------------------------------
    def check(self, live: set[Request]) -> None:
        if set(self._slots) - live:
            raise AssertionError("a state slot outlived its request")
        if set(self._verifying) & live:
            raise AssertionError("a verified draft's state was never settled (rolled back or kept)")
        if len(set(self._slots.values())) + self.pool.num_free != self.pool.num_slots:
            raise AssertionError(f"state slot leak: {len(self._slots)} used, {self.pool.num_free} free")
