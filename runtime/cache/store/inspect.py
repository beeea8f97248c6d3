"""Read a store's index without taking it: what ``kvreuse cache inspect`` prints, also while a server runs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from kvreuse.runtime.cache.store.disk import StoreError


def describe(directory: str | Path) -> dict:
    """What a store holds, read without taking it (``kvreuse cache inspect``): works while a server runs."""
    path = Path(directory) / "index.sqlite"
    if not path.is_file():
        raise StoreError(f"{directory} is not a kvreuse KV store (no index.sqlite)")
    try:
        return _read(directory, sqlite3.connect(f"file:{path}?mode=ro", uri=True))
    except sqlite3.DatabaseError as e:
        raise StoreError(f"KV store {directory}: index.sqlite is unreadable ({e})") from None


def _read(directory: str | Path, db: sqlite3.Connection) -> dict:
    try:
        meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
        pages, roots = db.execute("SELECT COUNT(*), COALESCE(SUM(is_root), 0) FROM pages").fetchone()
        groups, nbytes = db.execute("SELECT COUNT(*), COALESCE(SUM(nbytes), 0) FROM groups").fetchone()
        leaves = db.execute(
            "SELECT COUNT(*) FROM pages WHERE key NOT IN (SELECT parent FROM pages)"
        ).fetchone()[0]
    finally:
        db.close()
    return {
        "directory": str(directory), "fingerprint": meta.get("fingerprint"), "format": meta.get("format"),
        "pages": pages, "groups": groups, "bytes": nbytes, "prefix_roots": roots, "leaves": leaves,
    }  # fmt: skip
