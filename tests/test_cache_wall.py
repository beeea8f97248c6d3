"""The cache's wall (issue 52): outside ``runtime/cache/`` the runtime (engine, scheduler, server, gRPC
front, CLI) uses the cache manager only through its public methods (``CacheManager``'s methods and
properties, and ``page_size``), never through its parts (``.prefix``, ``.pins``, ``.shadows``,
``.tiers``, ``.allocator``, ``.states``, ...), and never asks the cache what it has with ``hasattr`` /
``getattr``.  The import side (no module above the cache imports the tree, its nodes or the prefix
cache interface) is an import contract in ``pyproject.toml``.

The check reads the code: every ``<x>.cache.<name>``, and ``cache.<name>`` where a function's
``cache`` parameter is a ``CacheManager``.  The last test shows it bites on a copy of the engine
that reaches through the cache again."""

from __future__ import annotations

import ast
from pathlib import Path

from kvreuse.runtime.cache.manager import CacheManager

ROOT = Path(__file__).resolve().parents[1]
PLAIN_VALUES = {"page_size"}  # public values of the manager that are not its parts
INTERFACE = {
    n
    for n, v in vars(CacheManager).items()
    if not n.startswith("_") and (callable(v) or isinstance(v, property))
} | PLAIN_VALUES


def _is_cache(node: ast.expr, params: set[str]) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "cache") or (
        isinstance(node, ast.Name) and node.id in params
    )


def reaches(source: str) -> list[tuple[int, str]]:
    """(line, what) for every use of the cache manager in ``source`` outside its public interface."""
    tree = ast.parse(source)
    found = []

    def visit(node: ast.AST, params: set[str]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args.args + node.args.kwonlyargs
            params = params | {
                a.arg
                for a in args
                if a.annotation is not None and "CacheManager" in ast.unparse(a.annotation)
            }
        if isinstance(node, ast.Attribute) and _is_cache(node.value, params) and node.attr not in INTERFACE:
            found.append((node.lineno, ast.unparse(node)))
        if (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr")
            and node.args and _is_cache(node.args[0], params)
        ):  # fmt: skip
            found.append((node.lineno, ast.unparse(node)))
        for child in ast.iter_child_nodes(node):
            visit(child, params)

    visit(tree, set())
    return found


def test_nothing_outside_the_cache_reaches_through_the_cache_manager():
    bad = {}
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        if (ROOT / "runtime/cache") in path.parents:
            continue
        hits = reaches(path.read_text())
        if hits:
            bad[str(path.relative_to(ROOT))] = hits
    assert bad == {}


def test_the_interface_is_what_the_issue_names():
    """Events, shadows, tier presence and the persist clock are operations of the cache."""
    assert {"listen", "announce", "shadow_stats", "tier_stats", "tier_error", "tick"} <= INTERFACE
    assert not {"prefix", "pins", "shadows", "tiers", "allocator", "states", "live"} & INTERFACE


def test_a_reach_through_is_found():
    engine = (ROOT / "runtime/engine/engine.py").read_text()
    assert reaches(engine) == []
    bad = engine.replace("self.cache.close()", "self.cache.tiers.error  # reach")
    bad += "\n\ndef f(cache: CacheManager):\n    return hasattr(cache, 'events'), cache.prefix.root\n"
    assert [what for _, what in reaches(bad)] == [
        "self.cache.tiers", "hasattr(cache, 'events')", "cache.prefix",
    ]  # fmt: skip
