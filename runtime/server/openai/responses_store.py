"""Stored responses: each tenant's own, with the token sequence the next turn continues.

A stored response keeps its response object, the conversation as template messages (input and its
own output) and its whole token sequence (prompt + output).  The KV pages of that sequence are pinned
under the response's own pin owner (``pin_owner``) by the request's cache scope, with the session
TTL and pin budget (``runtime/cache/pins.py``).  With ``--kv-store`` the records are written beside
the page store (one JSON line per record, a tombstone per delete; per model fingerprint), so a
restarted server continues a stored conversation from the disk tier's pages.

Delta records: a response that continues another (``previous_response_id``) is kept as a reference to
it (``parent``) plus what it adds: its first ``keep_messages`` messages and ``keep_tokens`` tokens are
its parent's, the rest are its own.  A conversation of n turns takes O(n) bytes instead of O(n^2)
(each record carrying the whole conversation again).  ``get`` returns a record whole; when a parent is
forgotten (deleted, or evicted by a budget) the part of it that its children share moves into them,
so a child never loses its conversation.  A record without ``parent`` is whole: files written before
delta records load as they are.

Budgets are per tenant: each keeps at most ``max_stored`` records (its own oldest go), and of the
byte budget ``max_bytes`` (with ``--kv-store``, half the records' share of ``--kv-store-size``: room to
compact) each tenant holding records has an equal share.  Over the budget, records go from the tenant
most over its share, its oldest first: a tenant within its share never loses a response to another
tenant's load (the shares sum to the budget, so whenever it is passed someone is over theirs).  The
file is compacted (rewritten with only the live records) before it would pass twice the live size
(plus a little) or twice ``max_bytes``, so it stays within the records' share and deletes and
replaced records never make it grow without bound.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kvreuse.runtime.server.errors import APIError
from kvreuse.runtime.server.openai.records_file import RecordsFile

log = logging.getLogger("kvreuse.server")

MAX_STORED = 4096  # records each tenant keeps: its own oldest go first
MAX_BYTES = 256 << 20  # the records' JSON bytes kept in all (without --kv-store: in memory)
COMPACT_SLACK = 1 << 20  # bytes the file may pass twice the live records by before it is compacted
DELTA_FIELDS = ("parent", "keep_messages", "keep_tokens")  # absent from a whole record's line


@dataclass
class StoredResponse:
    """One stored response (``tenant`` None: a server without API keys).  Whole (``parent`` None) as
    callers see it; inside the store a delta of ``parent`` (see the module docstring)."""

    id: str
    tenant: str | None
    body: dict[str, Any]  # the response object as answered
    instructions: str | None
    tools: list[dict] | None
    template_kwargs: dict[str, Any]
    messages: list[dict]  # the conversation up to and including this response's assistant message
    token_ids: list[int]  # prompt + output: what a response naming this one continues
    input_items: list[dict] = field(default_factory=list)  # this request's input, as listed by input_items
    parent: str | None = None  # a delta record: the record whose first keep_* items these continue
    keep_messages: int = 0
    keep_tokens: int = 0


def pin_owner(tenant: str | None, response_id: str) -> Hashable:
    return (tenant, "response", response_id)  # a tenant's pins lead with the tenant (cache_info)


def not_found(response_id: str, param: str | None) -> APIError:
    shown = response_id if len(response_id) <= 64 else response_id[:64] + "..."
    code = "previous_response_not_found" if param == "previous_response_id" else "response_not_found"
    return APIError(404, f"Response with id {shown!r} not found.", type="invalid_request_error",
                    param=param, code=code)  # fmt: skip


def _common(a: list, b: list) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _line_obj(rec: StoredResponse) -> dict[str, Any]:
    return {k: v for k, v in asdict(rec).items() if k not in DELTA_FIELDS or v}


def _well_formed(rec: StoredResponse) -> bool:
    """A line of the right field types (a damaged file must never stop the store from loading)."""
    ints = (rec.keep_messages, rec.keep_tokens)
    return (isinstance(rec.id, str) and isinstance(rec.messages, list) and isinstance(rec.token_ids, list)
            and (rec.parent is None or isinstance(rec.parent, str))
            and all(isinstance(k, int) and k >= 0 for k in ints))  # fmt: skip


def _rebase(child: StoredResponse, parent: StoredResponse) -> StoredResponse:
    """``child`` as a delta of ``parent``'s parent (the same whole): what it shared of ``parent``'s own
    items moves into it."""
    km, kt = child.keep_messages, child.keep_tokens
    messages = parent.messages[: max(0, km - parent.keep_messages)] + child.messages
    tokens = parent.token_ids[: max(0, kt - parent.keep_tokens)] + child.token_ids
    km, kt = min(km, parent.keep_messages), min(kt, parent.keep_tokens)
    up = parent.parent if km or kt else None
    return replace(child, parent=up, keep_messages=km, keep_tokens=kt, messages=messages, token_ids=tokens)


class ResponseStore:
    """Records by id, visible only to the tenant that made them; ``path`` (a JSON-lines file) persists
    them.  Invariants (``check``): ``_bytes[t]`` is the sum of ``_sizes`` over tenant ``t``'s records;
    a delta record's parent is a live record of its tenant, older than it, listed in ``_children``."""

    def __init__(
        self, path: Path | None = None, max_stored: int = MAX_STORED, max_bytes: int = MAX_BYTES
    ) -> None:
        self.max_stored, self.max_bytes = max_stored, max_bytes
        self.file = RecordsFile(path) if path is not None else None
        self._records: OrderedDict[str, StoredResponse] = OrderedDict()  # oldest first; deltas
        self._sizes: dict[str, int] = {}  # id -> its record's bytes (its line in the file)
        self._bytes: Counter[str | None] = Counter()  # tenant -> its records' bytes
        self._count: Counter[str | None] = Counter()  # tenant -> its records
        self._children: defaultdict[str, set[str]] = defaultdict(set)  # id -> its delta records' ids
        self._gone: dict[str, StoredResponse] | None = None  # while loading: forgotten records, by id
        self._running: dict[str, tuple[str | None, Any]] = {}  # id -> (tenant, the run)
        self._lock = threading.Lock()  # records are written in the event loop and read in the prep thread
        if self.file is not None:
            self._load(self.file)

    def error(self) -> str | None:
        """Why records are not being written (no path), or None: ``/health`` reads it."""
        return self.file.error if self.file is not None else None

    def share(self) -> float:
        """Each tenant's share of ``max_bytes``: an equal part for each tenant holding records."""
        return self.max_bytes / max(1, len(self._bytes))

    def _load(self, file: RecordsFile) -> None:
        """Replay the file.  A delta whose parent this replay already forgot (a budget smaller than the
        writer's) is rebased through the forgotten records; one whose parent never loaded (an unreadable
        line) cannot be made whole and is dropped with one warning."""
        self._gone, orphans = {}, 0
        for obj in file.read():  # a torn tail is dropped there, with one warning
            if "deleted" in obj:
                self._forget(obj["deleted"])
                self._enforce()  # as delete did
                continue
            try:
                rec = StoredResponse(**obj)
            except TypeError:  # a record of another shape: skipped like an unreadable line
                continue
            if not _well_formed(rec):
                continue
            while rec.parent is not None and rec.parent not in self._records and rec.parent in self._gone:
                rec = _rebase(rec, self._gone[rec.parent])
            parent = self._records.get(rec.parent) if rec.parent is not None else None
            if rec.parent is not None and (parent is None or parent.tenant != rec.tenant):
                orphans += 1
                continue
            self._remember(rec)
        self._gone = None
        if orphans:
            log.warning("stored responses: dropped %d record(s) whose earlier turns were unreadable", orphans)
        self._compact()

    def _whole(self, rec: StoredResponse) -> StoredResponse:
        chain = [rec]
        while chain[-1].parent is not None:
            chain.append(self._records[chain[-1].parent])
        messages: list[dict] = []
        tokens: list[int] = []
        for r in reversed(chain):  # in place: O(the deltas' length), not O(depth x length)
            del messages[r.keep_messages :], tokens[r.keep_tokens :]
            messages.extend(r.messages)
            tokens.extend(r.token_ids)
        return replace(rec, parent=None, keep_messages=0, keep_tokens=0, messages=messages, token_ids=tokens)

    def _delta(self, rec: StoredResponse, parent_id: str | None) -> StoredResponse:
        """``rec`` (whole) as a delta of ``parent_id`` where that is a live record of its tenant sharing
        a prefix with it; else whole."""
        parent = self._records.get(parent_id) if parent_id is not None else None
        if parent is None or parent.tenant != rec.tenant:
            return rec
        whole = self._whole(parent)
        km, kt = _common(whole.messages, rec.messages), _common(whole.token_ids, rec.token_ids)
        if not km and not kt:
            return rec
        return replace(rec, parent=parent_id, keep_messages=km, keep_tokens=kt,
                       messages=rec.messages[km:], token_ids=rec.token_ids[kt:])  # fmt: skip

    def _remember(self, rec: StoredResponse) -> None:
        self._forget(rec.id)
        self._set(rec)
        if self._count[rec.tenant] > self.max_stored:  # over its count: its own oldest goes
            self._forget(self._oldest(rec.tenant))
        self._enforce()

    def _enforce(self) -> None:
        """Within ``max_bytes``: the tenant most over its share loses its oldest records."""
        while sum(self._bytes.values()) > self.max_bytes and len(self._records) > 1:
            share = self.share()
            over = {t: n - share for t, n in self._bytes.items() if n > share}
            if not over:  # cannot be: the shares sum to the budget
                raise AssertionError(f"records over budget with no tenant over its share: {self._bytes}")
            self._forget(self._oldest(max(over, key=over.__getitem__)))

    def _set(self, rec: StoredResponse) -> None:
        """Add or replace ``rec`` (keeping its place in the order) with its size counted."""
        old = self._sizes.pop(rec.id, None)
        if old is None:
            self._count[rec.tenant] += 1
        else:
            self._bytes[rec.tenant] -= old
        self._records[rec.id] = rec
        self._sizes[rec.id] = size = len(RecordsFile.line(_line_obj(rec)))
        self._bytes[rec.tenant] += size
        if rec.parent is not None:
            self._children[rec.parent].add(rec.id)

    def _oldest(self, tenant: str | None) -> str:
        return next(i for i, r in self._records.items() if r.tenant == tenant)

    def _forget(self, response_id: str) -> None:
        rec = self._records.pop(response_id, None)
        if rec is None:
            return
        if self._gone is not None:
            self._gone[response_id] = rec
        self._bytes[rec.tenant] -= self._sizes.pop(response_id)
        self._count[rec.tenant] -= 1
        if not self._count[rec.tenant]:
            del self._bytes[rec.tenant], self._count[rec.tenant]
        if rec.parent is not None:
            self._children[rec.parent].discard(response_id)
        for child in self._children.pop(response_id, ()):
            self._set(_rebase(self._records[child], rec))  # its shared part moves into it

    def _append(self, obj: dict[str, Any]) -> bool:
        if self.file is None:
            return True
        line = len(RecordsFile.line(obj))
        live = sum(self._bytes.values())
        if self.file.size + line > min(2 * self.max_bytes, 2 * live + COMPACT_SLACK):
            self._compact()  # tombstones and forgotten records are most of the file
        return self.file.append(obj)

    def _compact(self) -> None:
        if self.file is not None:
            self.file.rewrite([_line_obj(r) for r in self._records.values()])

    def get(self, response_id: str, tenant: str | None, param: str | None = None) -> StoredResponse:
        """The tenant's record, whole, else a 404 (another tenant's id is as unknown as a made-up one)."""
        with self._lock:
            rec = self._records.get(response_id)
            if rec is None or rec.tenant != tenant:
                raise not_found(response_id, param)
            return self._whole(rec)

    def put(self, rec: StoredResponse, parent: str | None = None) -> bool:
        """Store ``rec`` (whole; kept as a delta of ``parent``, the response it continues, where that is
        still stored); False when it could not be written, or is larger than the whole budget (then it
        is not kept either: the response says ``store: false`` rather than vanish at the next restart)."""
        with self._lock:
            rec = self._delta(rec, parent)
            obj = _line_obj(rec)
            if len(RecordsFile.line(obj)) > self.max_bytes or not self._append(obj):
                return False
            self._remember(rec)
            return True

    def delete(self, response_id: str, tenant: str | None) -> StoredResponse:
        rec = self.get(response_id, tenant)
        with self._lock:
            self._forget(response_id)
            self._enforce()  # a parent's shared part moved into its children: two may hold it now
            self._append({"deleted": response_id})
        return rec

    def check(self) -> None:
        """The invariants in the class docstring; raises AssertionError naming the first that fails."""
        with self._lock:
            order = {i: n for n, i in enumerate(self._records)}
            bytes_: Counter[str | None] = Counter()
            for i, r in self._records.items():
                bytes_[r.tenant] += self._sizes[i]
                assert self._sizes[i] == len(RecordsFile.line(_line_obj(r))), f"{i}: size"
                if r.parent is not None:
                    p = self._records.get(r.parent)
                    assert p is not None and p.tenant == r.tenant, f"{i}: parent {r.parent} not live"
                    assert order[r.parent] < order[i] and i in self._children[r.parent], f"{i}: parent link"
                    whole = self._whole(p)
                    assert r.keep_messages <= len(whole.messages) and r.keep_tokens <= len(whole.token_ids)
            assert bytes_ == +self._bytes, (bytes_, self._bytes)
            assert all(c in self._records for cs in self._children.values() for c in cs), "stale child"

    # -- responses being generated (for cancel) --------------------------------------------------------
    def running(self, response_id: str, tenant: str | None, run: Any) -> None:
        """``run`` (with ``cancel()``) is being generated until ``done``."""
        self._running[response_id] = (tenant, run)

    def done(self, response_id: str) -> None:
        self._running.pop(response_id, None)

    def run_of(self, response_id: str, tenant: str | None) -> Any | None:
        """The tenant's run of that id while it is being generated, else None."""
        entry = self._running.get(response_id)
        return entry[1] if entry is not None and entry[0] == tenant else None
