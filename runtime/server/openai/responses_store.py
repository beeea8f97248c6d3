"""Stored responses: each tenant's own, with the token sequence the next turn continues.

A stored response keeps its response object, the conversation as template messages (input and its
own output) and its whole token sequence (prompt + output).  The KV pages of that sequence are pinned
under the response's own pin owner (``pin_owner``) by the request's cache scope, with the session
TTL and pin budget (``runtime/cache/pins.py``).  With ``--kv-store`` the records are written beside
the page store (one JSON line per record, a tombstone per delete; per model fingerprint), so a
restarted server continues a stored conversation from the disk tier's pages.

Budgets are per tenant: each keeps at most ``max_stored`` records (its own oldest go), and when all
records together pass ``max_bytes`` (with ``--kv-store``, their share of ``--kv-store-size``) the
tenant holding the most bytes loses its oldest, so one tenant's flood never pushes out another's
responses.  The file is compacted (rewritten with only the live records) when it grows past twice
their size, so deletes and replaced records never make it grow without bound.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvreuse.runtime.server.errors import APIError
from kvreuse.runtime.server.openai.records_file import RecordsFile

MAX_STORED = 4096  # records each tenant keeps: its own oldest go first
MAX_BYTES = 256 << 20  # the records' JSON bytes kept in all (without --kv-store: in memory)


@dataclass
class StoredResponse:
    """One stored response (``tenant`` None: a server without API keys)."""

    id: str
    tenant: str | None
    body: dict[str, Any]  # the response object as answered
    instructions: str | None
    tools: list[dict] | None
    template_kwargs: dict[str, Any]
    messages: list[dict]  # the conversation up to and including this response's assistant message
    token_ids: list[int]  # prompt + output: what a response naming this one continues
    input_items: list[dict] = field(default_factory=list)  # this request's input, as listed by input_items


def pin_owner(tenant: str | None, response_id: str) -> Hashable:
    return (tenant, "response", response_id)  # a tenant's pins lead with the tenant (cache_info)


def not_found(response_id: str, param: str | None) -> APIError:
    shown = response_id if len(response_id) <= 64 else response_id[:64] + "..."
    code = "previous_response_not_found" if param == "previous_response_id" else "response_not_found"
    return APIError(404, f"Response with id {shown!r} not found.", type="invalid_request_error",
                    param=param, code=code)  # fmt: skip


class ResponseStore:
    """Records by id, visible only to the tenant that made them; ``path`` (a JSON-lines file) persists
    them.  Invariant: ``_bytes[t]`` is the sum of ``_sizes`` over tenant ``t``'s records."""

    def __init__(
        self, path: Path | None = None, max_stored: int = MAX_STORED, max_bytes: int = MAX_BYTES
    ) -> None:
        self.max_stored, self.max_bytes = max_stored, max_bytes
        self.file = RecordsFile(path) if path is not None else None
        self._records: OrderedDict[str, StoredResponse] = OrderedDict()
        self._sizes: dict[str, int] = {}  # id -> its record's bytes
        self._bytes: Counter[str | None] = Counter()  # tenant -> its records' bytes
        self._count: Counter[str | None] = Counter()  # tenant -> its records
        self._running: dict[str, tuple[str | None, Any]] = {}  # id -> (tenant, the run)
        self._lock = threading.Lock()  # records are written in the event loop and read in the prep thread
        if self.file is not None:
            self._load(self.file)

    def error(self) -> str | None:
        """Why records are not being written (no path), or None: ``/health`` reads it."""
        return self.file.error if self.file is not None else None

    def _load(self, file: RecordsFile) -> None:
        for rec in file.read():  # a torn tail is dropped there, with one warning
            if "deleted" in rec:
                self._forget(rec["deleted"])
            else:
                try:
                    self._remember(StoredResponse(**rec), len(RecordsFile.line(rec)))
                except TypeError:  # a record of another shape: skipped like an unreadable line
                    continue
        self._compact()

    def _remember(self, rec: StoredResponse, size: int) -> None:
        self._forget(rec.id)
        self._records[rec.id], self._sizes[rec.id] = rec, size
        self._bytes[rec.tenant] += size
        self._count[rec.tenant] += 1
        if self._count[rec.tenant] > self.max_stored:  # over its count: its own oldest goes
            self._forget(next(i for i, r in self._records.items() if r.tenant == rec.tenant))
        while sum(self._bytes.values()) > self.max_bytes and len(self._records) > 1:
            top = max(self._bytes, key=self._bytes.__getitem__)  # the tenant holding most loses its oldest
            self._forget(next(i for i, r in self._records.items() if r.tenant == top))

    def _forget(self, response_id: str) -> None:
        rec = self._records.pop(response_id, None)
        if rec is not None:
            self._bytes[rec.tenant] -= self._sizes.pop(response_id)
            self._count[rec.tenant] -= 1
            if not self._count[rec.tenant]:
                del self._bytes[rec.tenant], self._count[rec.tenant]

    def _append(self, obj: dict[str, Any]) -> bool:
        if self.file is None:
            return True
        if not self.file.append(obj):
            return False
        if self.file.size > 2 * sum(self._bytes.values()) + (1 << 20):
            self._compact()  # tombstones and forgotten records are most of the file
        return True

    def _compact(self) -> None:
        if self.file is not None:
            self.file.rewrite([asdict(r) for r in self._records.values()])

    def get(self, response_id: str, tenant: str | None, param: str | None = None) -> StoredResponse:
        """The tenant's record, else a 404 (another tenant's id is as unknown as a made-up one)."""
        with self._lock:
            rec = self._records.get(response_id)
        if rec is None or rec.tenant != tenant:
            raise not_found(response_id, param)
        return rec

    def put(self, rec: StoredResponse) -> bool:
        """Store ``rec``; False when its record could not be written (then it is not kept either: the
        response says ``store: false`` rather than vanish at the next restart)."""
        with self._lock:
            obj = asdict(rec)
            if not self._append(obj):
                return False
            self._remember(rec, len(RecordsFile.line(obj)))
            return True

    def delete(self, response_id: str, tenant: str | None) -> StoredResponse:
        rec = self.get(response_id, tenant)
        with self._lock:
            self._forget(response_id)
            self._append({"deleted": response_id})
        return rec

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
