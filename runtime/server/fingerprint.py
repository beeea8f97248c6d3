"""``system_fingerprint``: names the backend configuration, so a client can tell when outputs may change."""

from __future__ import annotations

import hashlib
from importlib import metadata

from kvreuse.runtime.engine.engine import Engine


def system_fingerprint(engine: Engine) -> str:
    """``fp_`` + a hash of the model, dtype, device and the engine settings that change outputs.

    Stable for one model + configuration across restarts; any change of those gives another one.
    """
    c = engine.config
    try:
        version = metadata.version("kvreuse")
    except metadata.PackageNotFoundError:
        version = "dev"
    parts = (
        version, str(engine.model_dir.name), engine.model_name, str(engine.dtype), engine.device.type,
        c.page_size, c.chunk_size, c.attention_backend, c.seed,
    )  # fmt: skip
    return "fp_" + hashlib.sha256(repr(parts).encode()).hexdigest()[:12]
