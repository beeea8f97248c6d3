"""The disk tier's SQLite index file: opened only when sound, else replaced by a fresh one.

A crash, a full disk or a bad sector can leave ``index.sqlite`` unreadable: garbage where the header
was, a file cut short, a torn page inside.  SQLite's own queries notice some of these only when they
touch the damaged page (a torn page under ``pages`` passed every query the open makes and failed
later), so an open runs ``PRAGMA quick_check`` (the b-trees' structure, every page) before trusting
the file.  A file that fails is removed (with its WAL and shared-memory files) and a fresh index is
created with one warning: the server starts.  The index is the only record of each stored page's
tokens and parent (a group file names only its pages' key tags), so its pages cannot be rebuilt; the
opener deletes their group files as unindexed.  Nothing outside the index and ``groups/`` is touched
(the stored responses' records, window snapshots).
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

log = logging.getLogger("kvreuse.store")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS groups (
    id INTEGER PRIMARY KEY, file TEXT NOT NULL, nbytes INTEGER NOT NULL,
    checksum BLOB NOT NULL, last_use INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS pages (
    key BLOB PRIMARY KEY, parent BLOB NOT NULL, is_root INTEGER NOT NULL,
    tokens BLOB NOT NULL, grp INTEGER NOT NULL REFERENCES groups(id), idx INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS pages_grp ON pages(grp);
CREATE INDEX IF NOT EXISTS pages_parent ON pages(parent);
"""

_SIDE_FILES = ("-wal", "-shm", "-journal")  # SQLite's own files beside the database
_CORRUPT_CODES = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB


def connect(path: Path) -> sqlite3.Connection:
    """The index at ``path`` (created when absent), checked page by page; raises
    ``sqlite3.DatabaseError`` when the file is not a sound SQLite database."""
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        problems = [row[0] for row in db.execute("PRAGMA quick_check").fetchall()]
        if problems != ["ok"]:
            raise sqlite3.DatabaseError("quick_check: " + "; ".join(problems[:3]).replace("\n", " "))
        db.executescript(SCHEMA)
    except sqlite3.DatabaseError:
        db.close()
        raise
    return db


def corrupt(error: sqlite3.DatabaseError) -> bool:
    """Whether ``error`` says the file itself is damaged (not a database, malformed, failed the check),
    as opposed to one that leaves a sound file unread (a full disk, no permission: never replaced)."""
    return type(error) is sqlite3.DatabaseError or getattr(error, "sqlite_errorcode", None) in _CORRUPT_CODES


def replace_corrupt(path: Path, error: sqlite3.DatabaseError) -> None:
    """Remove an unreadable index (and its side files) so that ``connect`` creates a fresh one."""
    log.warning("KV store %s: %s is unreadable (%s); starting with a fresh index: the pages it indexed are "
                "dropped and recomputed on use", path.parent, path.name, str(error).splitlines()[0][:200])  # fmt: skip
    for p in [path, *(path.with_name(path.name + s) for s in _SIDE_FILES)]:
        p.unlink(missing_ok=True)
