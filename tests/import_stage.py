"""A tree laid out as the wheel installs the project: ``<stage>/kvreuse/<folder>`` for each folder at the
repository root, as symbolic links. grimp (and so ``lint-imports``) finds packages through ``sys.path``
and names a namespace package (``kvreuse.kernels`` has no ``__init__.py``) by its directory's path, so it
needs that path to read ``kvreuse/kernels``; an editable install maps the folders elsewhere."""

from __future__ import annotations

from pathlib import Path

FOLDERS = ("runtime", "kernels", "chat_templates", "benchmarks")
ROOT = Path(__file__).resolve().parents[1]


def stage(into: Path, root: Path = ROOT) -> Path:
    """``into`` with ``kvreuse/<folder>`` linked to ``root/<folder>``; put ``into`` first on ``sys.path``."""
    package = into / "kvreuse"
    package.mkdir(parents=True, exist_ok=True)
    for folder in FOLDERS:
        link = package / folder
        if link.is_symlink():
            link.unlink()
        link.symlink_to(root / folder, target_is_directory=True)
    return into
