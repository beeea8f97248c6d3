"""Builds the plain-C CPU kernels under ``kernels/cpu/`` with the machine's compiler, once, and loads them.

Why C and ctypes rather than a torch C++ extension: the sources need no torch headers, so the
compiler builds each in about a second (a torch extension takes a minute), and a ctypes call costs
~2 us.  The libraries link the OpenMP runtime torch already loaded (same soname), so they share
torch's threads and thread count.

A build goes to ``$KVREUSE_CACHE`` (default ``~/.cache/kvreuse``)``/native/``, keyed by the source, the
flags, the compiler and the CPU, so a changed file or another machine never loads a stale build;
it is written beside its target and renamed, so concurrent processes never load half a library.
``KVREUSE_NATIVE=0`` disables them all (every caller keeps its torch path).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

# -ffp-contract=off: no implicit fused multiply-adds, so elementwise results round where torch's do
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC", "-std=c11"]


def _cache_dir() -> Path:
    return Path(os.environ.get("KVREUSE_CACHE", Path.home() / ".cache" / "kvreuse")) / "native"


def _cpu_id() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        return next(line for line in text.splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return platform.processor()


def _build(cc: str, source: Path, extra: tuple[str, ...] = ()) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))  # what it includes
    flags = FLAGS + list(extra)
    key = hashlib.sha256(
        source.read_bytes() + headers + " ".join(flags + [version, _cpu_id()]).encode()
    ).hexdigest()
    target = _cache_dir() / f"{source.stem}-{key[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so")
    os.close(fd)
    try:
        subprocess.run(
            [cc, *flags, str(source), "-o", tmp, "-lm"], capture_output=True, check=True, timeout=120
        )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@cache  # one load per source and process, like an import: the library never changes once loaded
def compile_library(source: Path, extra: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """``source`` built (or found built) and loaded; ``None`` without a compiler or when the build fails.
    ``extra``: flags after the defaults, e.g. ``("-mno-avx512f",)`` for the code another CPU would run."""
    if os.environ.get("KVREUSE_NATIVE", "1") == "0":
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        _fallback("no C compiler found (install gcc, or set CC)")
        return None
    try:
        return ctypes.CDLL(str(_build(cc, source, extra)))
    except (OSError, subprocess.SubprocessError) as e:
        _fallback(f"the build with {cc} failed ({type(e).__name__})")
        return None


@cache  # one line per process and reason, not one per kernel source
def _fallback(reason: str) -> None:
    print(f"kvreuse: C kernels unavailable, {reason}: using the torch kernels", file=sys.stderr)
