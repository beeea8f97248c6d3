"""The disk tier: KV pages in checksummed safetensors files, indexed in SQLite.

Layout of a store directory::

    LOCK                 flock'ed by the one server that has the store open
    index.sqlite         meta(fingerprint, format), groups(file, bytes, checksum, last use), pages;
                         an unreadable one is replaced by a fresh one at open (``index_db``)
    groups/<id>.safetensors   one "kv" tensor [n_pages, layers, 2, page_size, kv_heads, head_dim]
    tmp/                 writes in progress; whatever is left here after a crash is deleted at open

A page is keyed by :mod:`kvreuse.runtime.cache.store.page_keys` (the chain of its prefix) and records its parent
key and its tokens, so the index is a tree that rebuilds without the pool.  A write is a group of
consecutive pages: written under ``tmp/``, fsynced, renamed into ``groups/``, only then indexed, so a
crash leaves a whole indexed group or an unindexed file the next open removes.  Every group's CRC-32
is checked on load; a group that fails it (truncated, flipped byte) is dropped with every page below
it, and the caller recomputes those tokens.  The byte budget is kept by evicting least recently used
groups; a page below an evicted one can never match again and goes with it.  A page may arrive before
its parent (a host tier above evicts in its own order); an open drops whatever parent never came.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from kvreuse.runtime.cache.store import group_file, index_db
from kvreuse.runtime.cache.store.fingerprint import FORMAT_VERSION


class StoreError(ValueError):
    """The store cannot be used as asked (in use, another model, another format); one-line message."""


class PageRecord(NamedTuple):
    """One stored page: its key, its parent's key (a root key when ``is_root``), its tokens."""

    key: bytes
    parent: bytes
    is_root: bool
    tokens: tuple[int, ...]


class StoreStats(NamedTuple):
    """What the store holds now."""

    pages: int
    groups: int
    nbytes: int
    budget: int


def _holds(group: tuple[torch.Tensor, list[str]], wanted: list[tuple[bytes, int]]) -> bool:
    """Whether a group file holds each (key, index) the index points at, by the file's own record of
    its keys (an entry past the end or at a swapped file must never be served, checksum or not)."""
    kv, tags = group
    return all(0 <= i < kv.shape[0] and i < len(tags) and tags[i] == group_file.key_tag(k) for k, i in wanted)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DiskStore:
    """KV pages on disk under a byte budget; one process at a time (see module docstring)."""

    def __init__(self, directory: str | Path, fingerprint: str, budget_bytes: int) -> None:
        self.dir = Path(directory)
        self.budget = int(budget_bytes)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "groups").mkdir(exist_ok=True)
        (self.dir / "tmp").mkdir(exist_ok=True)
        self._lock_fd = os.open(self.dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise StoreError(f"KV store {self.dir} is in use by another kvreuse process") from None
        self._mu = threading.Lock()
        self._db = None
        path = self.dir / "index.sqlite"
        for attempt in range(2):  # an unreadable index is replaced by a fresh one, once (index_db)
            try:
                self._db = index_db.connect(path)
                self._check_fingerprint(fingerprint)
                self._clock = self._db.execute("SELECT COALESCE(MAX(last_use), 0) FROM groups").fetchone()[0]
                self._recover()
                break
            except sqlite3.DatabaseError as e:
                if self._db is not None:
                    self._db.close()
                    self._db = None
                if attempt or not index_db.corrupt(e):  # e.g. a full disk: the index may be sound
                    self.close()
                    raise StoreError(f"KV store {self.dir}: index.sqlite cannot be opened ({e})") from None
                index_db.replace_corrupt(path, e)

    # -- opening ---------------------------------------------------------------------
    def _check_fingerprint(self, fingerprint: str) -> None:
        rows = dict(self._db.execute("SELECT name, value FROM meta").fetchall())
        if not rows:
            self._db.executemany(
                "INSERT INTO meta VALUES (?, ?)",
                [("fingerprint", fingerprint), ("format", str(FORMAT_VERSION))],
            )
            return
        if rows.get("format") != str(FORMAT_VERSION):
            self.close()
            raise StoreError(
                f"KV store {self.dir} has format {rows.get('format')}, this kvreuse writes {FORMAT_VERSION}"
            )
        if rows.get("fingerprint") != fingerprint:
            self.close()
            raise StoreError(
                f"KV store {self.dir} was written for another model or settings (fingerprint "
                f"{rows.get('fingerprint', '?')[:12]} != {fingerprint[:12]}); use another --kv-store or clear it"
            )

    def _recover(self) -> None:
        """Remove what a crash can leave: temp files, unindexed group files, pages of missing files."""
        for f in (self.dir / "tmp").iterdir():
            f.unlink(missing_ok=True)
        known = {row[0] for row in self._db.execute("SELECT file FROM groups")}
        for f in (self.dir / "groups").iterdir():
            if f.name not in known:
                f.unlink(missing_ok=True)
        missing = [
            gid
            for gid, name in self._db.execute("SELECT id, file FROM groups")
            if not (self.dir / "groups" / name).is_file()
        ]
        with self._mu:
            for gid in missing:
                self._drop_group(gid)
            self._drop_orphans()

    # -- queries ---------------------------------------------------------------------
    def match(self, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` are stored; marks their groups as used."""
        n = 0
        groups = set()
        with self._mu:
            for k in keys:
                row = self._db.execute("SELECT grp FROM pages WHERE key = ?", (k,)).fetchone()
                if row is None:
                    break
                groups.add(row[0])
                n += 1
            self._touch(groups)
        return n

    def get(self, keys: Sequence[bytes]) -> torch.Tensor | None:
        """The pages' K/V stacked ``[n, ...]``, or None if any is missing or fails its checksum.

        Files are read and checked outside the index lock (a prefetch thread reads while the engine
        matches); a group that fails its checksum is dropped (with the pages below it), never served.
        """
        with self._mu:
            rows = [
                self._db.execute("SELECT grp, idx FROM pages WHERE key = ?", (k,)).fetchone() for k in keys
            ]
            if any(r is None for r in rows):
                return None
            files = {
                gid: self._db.execute("SELECT file, checksum FROM groups WHERE id = ?", (gid,)).fetchone()
                for gid in {r[0] for r in rows}
            }
        loaded: dict[int, torch.Tensor] = {}
        for gid, (name, checksum) in files.items():
            group = self._read_group(name, checksum)
            wanted = [(k, i) for k, (g, i) in zip(keys, rows) if g == gid]
            if group is None or not _holds(group, wanted):  # unreadable, or not the pages the index says
                with self._mu:
                    self._drop_group(gid)
                return None
            loaded[gid] = group[0]
        with self._mu:
            self._touch(loaded)
        g0, i0 = rows[0]
        if all(r == (g0, i0 + j) for j, r in enumerate(rows)):  # one group's consecutive pages: a view
            return loaded[g0][i0 : i0 + len(rows)]
        return torch.stack([loaded[g][i] for g, i in rows])

    def records(self) -> Iterator[PageRecord]:
        """Every stored page, parents before children (for rebuilding an index or inspecting)."""
        with self._mu:
            rows = self._db.execute("SELECT key, parent, is_root, tokens FROM pages").fetchall()
        children: dict[bytes, list] = {}
        roots = []
        for key, parent, is_root, tokens in rows:
            rec = PageRecord(
                key,
                parent,
                bool(is_root),
                tuple(torch.frombuffer(bytearray(tokens), dtype=torch.int64).tolist()),
            )
            (roots if is_root else children.setdefault(parent, [])).append(rec)
        stack = roots[::-1]
        while stack:
            rec = stack.pop()
            yield rec
            stack.extend(children.get(rec.key, [])[::-1])

    def chains(self, root: bytes) -> list[list[int]]:
        """The token sequence of every stored root-to-leaf path that starts at ``root``, longest first."""
        paths: dict[bytes, list[int]] = {}
        parents: set[bytes] = set()
        for r in self.records():
            if r.is_root:
                if r.parent != root:
                    continue
                paths[r.key] = list(r.tokens)
            elif r.parent in paths:
                paths[r.key] = paths[r.parent] + list(r.tokens)
                parents.add(r.parent)
        return sorted((p for k, p in paths.items() if k not in parents), key=len, reverse=True)

    def stats(self) -> StoreStats:
        with self._mu:
            pages = self._db.execute("SELECT COUNT(*) FROM pages").fetchone()[0]
            groups, nbytes = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(nbytes), 0) FROM groups"
            ).fetchone()
        return StoreStats(pages, groups, nbytes, self.budget)

    def check(self) -> StoreStats:
        """The store's invariants: within budget, every page in an indexed group whose file exists;
        raises AssertionError naming what fails (parents: see :meth:`orphan_parents`)."""
        with self._mu:
            db = self._db
            bad_grp = db.execute(
                "SELECT COUNT(*) FROM pages WHERE grp NOT IN (SELECT id FROM groups)"
            ).fetchone()[0]
            files = [row[0] for row in db.execute("SELECT file FROM groups")]
        missing = [f for f in files if not (self.dir / "groups" / f).is_file()]
        s = self.stats()
        if s.nbytes > s.budget:
            raise AssertionError(f"KV store over budget: {s}")
        if bad_grp or missing:
            raise AssertionError(
                f"KV store index broken: {bad_grp} pages without group, missing files {missing[:3]}"
            )
        return s

    def orphan_parents(self) -> set[bytes]:
        """Parents of stored pages that are not stored here (a host tier may still hold them)."""
        with self._mu:
            rows = self._db.execute(
                "SELECT DISTINCT parent FROM pages WHERE is_root = 0 AND parent NOT IN (SELECT key FROM pages)"
            ).fetchall()
        return {r[0] for r in rows}

    # -- writes ------------------------------------------------------------------------
    def put(
        self,
        parent: bytes,
        parent_is_root: bool,
        keys: Sequence[bytes],
        tokens: Sequence[Sequence[int]],
        kv: torch.Tensor,
    ) -> int:
        """Store consecutive pages (``kv[i]`` is page ``keys[i]``) after ``parent``; returns pages written.

        Pages already stored are skipped; a group larger than the whole budget is not stored.
        """
        with self._mu:
            known = {
                k for k in keys if self._db.execute("SELECT 1 FROM pages WHERE key = ?", (k,)).fetchone()
            }
        first_new = next((i for i, k in enumerate(keys) if k not in known), len(keys))
        if first_new == len(keys):
            return 0
        if first_new:
            parent, parent_is_root = keys[first_new - 1], False
        keys, tokens, kv = keys[first_new:], tokens[first_new:], kv[first_new:]
        data = group_file.encode(kv, list(keys))
        if len(data) > self.budget:
            return 0
        name = f"{uuid.uuid4().hex}.safetensors"
        tmp = self.dir / "tmp" / name
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / "groups" / name)
        _fsync_dir(self.dir / "groups")
        with self._mu:
            self._evict_for(len(data))
            self._clock += 1
            cur = self._db.cursor()
            cur.execute("BEGIN")
            cur.execute(
                "INSERT INTO groups (file, nbytes, checksum, last_use) VALUES (?, ?, ?, ?)",
                (name, len(data), group_file.checksum(data), self._clock),
            )
            gid = cur.lastrowid
            prev, prev_root = parent, parent_is_root
            for i, (k, toks) in enumerate(zip(keys, tokens)):
                cur.execute(
                    "INSERT INTO pages VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        k,
                        prev,
                        int(prev_root),
                        torch.tensor(list(toks), dtype=torch.int64).numpy().tobytes(),
                        gid,
                        i,
                    ),
                )
                prev, prev_root = k, False
            cur.execute("COMMIT")
        return len(keys)

    def clear(self) -> None:
        with self._mu:
            for (gid,) in self._db.execute("SELECT id FROM groups").fetchall():
                self._drop_group(gid)

    def close(self) -> None:
        if getattr(self, "_db", None) is not None:
            self._db.close()
            self._db = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    # -- internals (hold self._mu) -------------------------------------------------------
    def _touch(self, groups) -> None:
        if groups:
            self._clock += 1
            self._db.executemany(
                "UPDATE groups SET last_use = ? WHERE id = ?", [(self._clock, g) for g in groups]
            )

    def _read_group(self, name: str, checksum: bytes) -> tuple[torch.Tensor, list[str]] | None:
        return group_file.read(self.dir / "groups" / name, checksum)

    def _evict_for(self, nbytes: int) -> None:
        used = self._db.execute("SELECT COALESCE(SUM(nbytes), 0) FROM groups").fetchone()[0]
        while used + nbytes > self.budget:
            row = self._db.execute("SELECT id, nbytes FROM groups ORDER BY last_use LIMIT 1").fetchone()
            if row is None:
                break
            self._drop_group(row[0])
            used = self._db.execute("SELECT COALESCE(SUM(nbytes), 0) FROM groups").fetchone()[0]

    def _drop_group(self, gid: int) -> None:
        """Delete a group's pages and file, and every stored page below them (they can never match)."""
        row = self._db.execute("SELECT file FROM groups WHERE id = ?", (gid,)).fetchone()
        gone = [k for (k,) in self._db.execute("SELECT key FROM pages WHERE grp = ?", (gid,))]
        self._db.execute("DELETE FROM pages WHERE grp = ?", (gid,))
        self._db.execute("DELETE FROM groups WHERE id = ?", (gid,))
        if row is not None:
            try:
                (self.dir / "groups" / row[0]).unlink(missing_ok=True)
            except OSError:  # groups/ is gone or not a directory: the index entry goes all the same
                pass
        while gone:
            below = []
            for k in gone:
                below += [c for (c,) in self._db.execute("SELECT key FROM pages WHERE parent = ?", (k,))]
            self._db.executemany("DELETE FROM pages WHERE key = ?", [(k,) for k in below])
            gone = below
        for (empty,) in self._db.execute(
            "SELECT id FROM groups WHERE id NOT IN (SELECT DISTINCT grp FROM pages)"
        ).fetchall():
            self._drop_group(empty)

    def _drop_orphans(self) -> None:
        """At open: pages whose parent is stored nowhere can never match; drop them."""
        while self._db.execute(
            "DELETE FROM pages WHERE is_root = 0 AND parent NOT IN (SELECT key FROM pages)"
        ).rowcount:
            pass
        for (gid,) in self._db.execute(
            "SELECT id FROM groups WHERE id NOT IN (SELECT DISTINCT grp FROM pages)"
        ).fetchall():
            self._drop_group(gid)
