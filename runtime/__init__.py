"""kvreuse runtime: the public API is ``Engine``, ``AsyncEngine`` and ``SamplingParams``.

Imported lazily, so ``import kvreuse.runtime.cli.main`` (and ``kvreuse --help``) does not load torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvreuse.runtime.engine.async_engine import AsyncEngine
    from kvreuse.runtime.engine.engine import Engine
    from kvreuse.runtime.sampling.params import SamplingParams

__all__ = ["AsyncEngine", "Engine", "SamplingParams"]

_HOMES = {
    "Engine": "kvreuse.runtime.engine.engine",
    "AsyncEngine": "kvreuse.runtime.engine.async_engine",
    "SamplingParams": "kvreuse.runtime.sampling.params",
}


def __getattr__(name: str):
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'kvreuse.runtime' has no attribute {name!r}")
