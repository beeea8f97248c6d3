"""The import contracts in pyproject.toml hold: imports flow one way (CLI at the top, kernels at the
bottom, every package's modules in layers), and no import cycle exists anywhere in ``runtime/``.

The last two tests show the checks bite: on a copy of the tree, one upward import breaks a contract
and one two-module cycle is found."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from tests.import_stage import FOLDERS, stage

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(root: Path, staged: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports not installed: pip install -e '.[test]' (import-linter)")
    env = {**os.environ, "PYTHONPATH": str(stage(staged, root))}
    return subprocess.run([exe, "--no-cache"], cwd=root, capture_output=True, text=True, env=env, timeout=300)


def build_graph(package: str, staged: Path, root: Path = ROOT, **kwargs) -> grimp.ImportGraph:
    """grimp's graph of ``kvreuse.<package>`` as laid out under ``root``."""
    # grimp finds the package through sys.path; an already-imported one would be found in sys.modules
    loaded = {m: sys.modules.pop(m) for m in list(sys.modules) if m == "kvreuse" or m.startswith("kvreuse.")}
    sys.path.insert(0, str(stage(staged, root)))
    try:
        return grimp.build_graph(f"kvreuse.{package}", cache_dir=None, **kwargs)
    finally:
        sys.path.remove(str(staged))
        for m in [m for m in sys.modules if m == "kvreuse" or m.startswith("kvreuse.")]:
            del sys.modules[m]
        sys.modules.update(loaded)


def import_cycles(package: str, staged: Path, root: Path = ROOT) -> list[list[str]]:
    """Every strongly connected set of two or more modules of ``package``, imports under
    ``TYPE_CHECKING`` and inside functions included (Tarjan over grimp's graph)."""
    graph = build_graph(package, staged, root, exclude_type_checking_imports=False)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the import chain's length
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in graph.modules:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in sorted(graph.modules):
        if m not in index:
            visit(m)
    return cycles


def test_import_contracts_hold(tmp_path: Path):
    r = lint_imports(ROOT, tmp_path / "stage")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


@pytest.mark.parametrize("package", ["runtime", "benchmarks"])
def test_no_import_cycles(package: str, tmp_path: Path):
    assert import_cycles(package, tmp_path) == []


@pytest.fixture()
def tree_copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    for name in FOLDERS:
        shutil.copytree(ROOT / name, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


def test_an_upward_import_breaks_a_contract(tree_copy: Path):
    _append(
        tree_copy / "runtime/cache/pins.py", "import kvreuse.runtime.scheduler  # noqa"
    )  # cache -> scheduler
    r = lint_imports(tree_copy, tree_copy.parent / "stage")
    assert (
        r.returncode != 0
        and "kvreuse.runtime.cache is not allowed to import kvreuse.runtime.scheduler" in r.stdout
    )


def test_a_cycle_is_found(tree_copy: Path):
    # two leaves of one layer that never imported each other: no contract names this pair
    _append(tree_copy / "runtime/server/metrics.py", "import kvreuse.runtime.server.fingerprint  # noqa")
    _append(tree_copy / "runtime/server/fingerprint.py", "import kvreuse.runtime.server.metrics  # noqa")
    assert import_cycles("runtime", tree_copy.parent / "stage", tree_copy) == [
        ["kvreuse.runtime.server.fingerprint", "kvreuse.runtime.server.metrics"]
    ]


def test_an_upward_import_inside_a_subpackage_breaks_a_contract(tree_copy: Path):
    """Inside ``models`` and ``server.openai`` too (no cycle: only their own contracts can see these)."""
    _append(tree_copy / "runtime/models/block_int8.py", "import kvreuse.runtime.models.summary  # noqa")
    _append(
        tree_copy / "runtime/server/openai/responses_store.py",
        "import kvreuse.runtime.server.openai.chat  # noqa",
    )
    r = lint_imports(tree_copy, tree_copy.parent / "stage")
    said = " ".join(r.stdout.split())  # the report wraps its lines
    assert r.returncode != 0
    for low, high in (
        ("models.block_int8", "models.summary"),
        ("server.openai.responses_store", "server.openai.chat"),
    ):
        assert f"kvreuse.runtime.{low} is not allowed to import kvreuse.runtime.{high}" in said


def unlisted_modules(staged: Path, root: Path = ROOT) -> dict[str, list[str]]:
    """Per package of ``runtime`` (every module with children, at any depth), the children no contract
    names: a layers contract over it (``kvreuse.runtime`` itself: the main one, without containers) or an
    independence contract among its children."""
    import tomllib

    contracts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    named: dict[str, set[str]] = {}  # package -> the children its contracts name
    for c in contracts:
        if c.get("type") == "layers":
            kids = {part.strip() for layer in c["layers"] for part in layer.split("|")}
            for container in c.get("containers", [""]):
                for kid in kids:  # the main contract names full paths, the others names within the container
                    package, _, name = (kid if not container else f"{container}.{kid}").rpartition(".")
                    named.setdefault(package, set()).add(name)
        elif c.get("type") == "independence":
            for module in c["modules"]:
                package, _, name = module.rpartition(".")
                named.setdefault(package, set()).add(name)
    graph = build_graph("runtime", staged, root)
    unlisted = {}
    for package in sorted(m for m in graph.modules if graph.find_children(m)):
        kids = {k.rpartition(".")[2] for k in graph.find_children(package)}
        missing = sorted(kids - named.get(package, set()))
        if missing:
            unlisted[package] = missing
    return unlisted


def test_the_contracts_name_every_module(tmp_path: Path):
    """Every module of every package of ``runtime`` (``models``, ``server.openai``, ``cache.store``, ...)
    sits in a contract: a new module must take a layer."""
    assert unlisted_modules(tmp_path) == {}


def test_a_new_module_without_a_layer_is_found(tree_copy: Path):
    (tree_copy / "runtime/cache/store/extra.py").write_text('"""A module no contract names."""\n')
    (tree_copy / "runtime/models/extra.py").write_text('"""A module no contract names."""\n')
    assert unlisted_modules(tree_copy.parent / "stage", tree_copy) == {
        "kvreuse.runtime.cache.store": ["extra"],
        "kvreuse.runtime.models": ["extra"],
    }
