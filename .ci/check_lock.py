"""Does requirements.lock agree with pyproject.toml? Every dependency that pyproject.toml declares (the
runtime's and the ``test`` extra's) must be pinned in the lock at a version its specifier allows.

``python3 .ci/check_lock.py``: exit 0 when they agree, else 1 with what disagrees and the command that
fixes it. ``--platform``: exit 0 when this interpreter is the one the lock was resolved for (CI's), else
1 with one line saying so. ``--test-pins``: print the lock's pins of the test extra's own packages
(``make test-oldest`` holds the test tools there while the runtime's dependencies go to their oldest). Runs before anything is installed, so it needs only the standard library and
pip (whose vendored ``packaging`` it borrows when ``packaging`` itself is not installed).
"""

from __future__ import annotations

import platform
import re
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare interpreter: pip carries its own copy
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
EXTRAS = ("test",)
# What `make lock` resolves for: CI's interpreter and machine
LOCK_PYTHON = (3, 11)
LOCK_MACHINE = "x86_64"
FIX = "make lock  (then commit requirements.lock)"


def pins(lock_text: str) -> dict[str, str]:
    return {
        canonicalize_name(m.group(1)): m.group(2)
        for m in re.finditer(r"(?m)^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", lock_text)
    }


def declared(runtime: bool = True, extras: tuple[str, ...] = EXTRAS) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"]) if runtime else []
    for extra in extras:
        specs += project["optional-dependencies"][extra]
    return [Requirement(s) for s in specs]


def disagreements(reqs: list[Requirement], pinned: dict[str, str]) -> list[str]:
    env = {**default_environment(), "python_version": ".".join(map(str, LOCK_PYTHON)), "platform_machine": LOCK_MACHINE,
           "sys_platform": "linux", "platform_system": "Linux", "extra": ""}  # fmt: skip
    out = []
    for req in reqs:
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        version = pinned.get(canonicalize_name(req.name))
        if version is None:
            out.append(f"{req} is not in the lock")
        elif not req.specifier.contains(version, prereleases=True):
            out.append(f"{req} is not met by the lock's {req.name}=={version}")
    return out


def main(argv: list[str]) -> int:
    if "--platform" in argv:
        here = (sys.version_info[:2], platform.machine(), sys.platform)
        if here == (LOCK_PYTHON, LOCK_MACHINE, "linux"):
            return 0
        print(
            f"requirements.lock is resolved for CPython {'.'.join(map(str, LOCK_PYTHON))} on {LOCK_MACHINE} Linux"
            f" (CI's); this is {'.'.join(map(str, here[0]))} on {here[1]} {here[2]}: installing the newest"
            " releases instead, as `make test-latest` does"
        )
        return 1
    if "--test-pins" in argv:
        pinned, runtime = pins(LOCK.read_text()), {canonicalize_name(r.name) for r in declared(extras=())}
        names = {canonicalize_name(r.name) for r in declared(runtime=False)} - runtime
        print("".join(f"{n}=={pinned[n]}\n" for n in sorted(names) if n in pinned), end="")
        return 0
    if not LOCK.exists():
        print(f"requirements.lock is missing: {FIX}")
        return 1
    bad = disagreements(declared(), pins(LOCK.read_text()))
    if bad:
        print("requirements.lock disagrees with pyproject.toml:")
        print("".join(f"  - {b}\n" for b in bad), end="")
        print(f"fix: {FIX}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
