"""The stored responses' JSON-lines file: read back past a torn tail, appended one whole line at a time,
rewritten atomically.

A crash mid-append leaves at most one unreadable line at the end (a write cut mid-record, even
mid-character): reading drops it with one warning and the store rewrites the file whole, so nothing
else is lost and the next start is clean.  A failed append (disk full, directory gone) is undone where
the file can still be cut back, reported as ``error`` (no path: it reaches ``/health``), and never
raised: the caller serves its answer unstored.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("kvreuse.server")


def _reason(e: OSError) -> str:
    return os.strerror(e.errno) if e.errno else type(e).__name__  # never str(e): it names the path


class RecordsFile:
    """One JSON-lines file; ``error`` is why the last write failed (None once a write succeeds)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.error: str | None = None
        self.size = 0  # bytes in the file, as this process wrote or read them

    def read(self) -> list[dict[str, Any]]:
        """Every whole record; unreadable lines (a torn tail) are dropped with one warning."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        self.size = len(data)
        lines = data.split(b"\n")
        torn = 1 if lines.pop() else 0  # the bytes after the last newline: a write cut short
        out: list[dict[str, Any]] = []
        for raw in lines:
            try:
                rec = json.loads(raw.decode("utf-8"))
            except ValueError:  # UnicodeDecodeError is a ValueError too
                torn += 1
                continue
            if isinstance(rec, dict):
                out.append(rec)
            else:
                torn += 1
        if torn:
            log.warning("stored responses: dropped %d unreadable line(s) of %s (a write cut short)",
                        torn, self.path.name)  # fmt: skip
        return out

    @staticmethod
    def line(obj: dict[str, Any]) -> bytes:
        return (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")

    def append(self, obj: dict[str, Any]) -> bool:
        """Append one record as one ``write``; False (and ``error`` set) when it could not be written."""
        line = self.line(obj)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as e:
            return self._failed(e)
        try:
            start = os.fstat(fd).st_size
            try:
                if os.write(fd, line) != len(line):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError as e:
                try:  # a part-written line would spoil the next one: cut it back
                    os.ftruncate(fd, start)
                except OSError:
                    pass  # read() drops it at the next start
                return self._failed(e)
        finally:
            os.close(fd)
        self.size = start + len(line)
        self.error = None
        return True

    def rewrite(self, objs: list[dict[str, Any]]) -> bool:
        """Replace the file by ``objs`` atomically (a temporary file, fsync, rename)."""
        data = b"".join(self.line(o) for o in objs)
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with tmp.open("wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            tmp.unlink(missing_ok=True) if not tmp.is_dir() else None
            return self._failed(e)
        self.size = len(data)
        self.error = None
        return True

    def _failed(self, e: OSError) -> bool:
        self.error = f"stored responses are not written ({_reason(e)}): answers are served unstored"
        log.error("stored responses: writing %s failed: %s", self.path.name, _reason(e))
        return False
