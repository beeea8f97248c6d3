"""The model-state wall (issue 52): per-request model state (a hybrid's recurrent states, a window
model's rings, none) is one interface, ``runtime/runner/model_state.py``'s ``ModelState``, chosen once
from the model's config in ``runtime/runner/state_kinds.py``.  Outside the implementations and that
registry, the runtime and the benchmarks never name a kind's class (so no ``isinstance`` on it), never
ask the state what it has with ``getattr`` / ``hasattr``, and never test it against None: they call
its methods and read its facts.

The check reads the code; the last tests show it bites on main's code before the interface (issue 52
counted 8 such branches in 4 files) and that every kind answers the whole interface."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from kvreuse.runtime.models.config import ModelConfig
from kvreuse.runtime.runner import state_kinds
from kvreuse.runtime.runner.model_state import ModelState
from tests.helpers import make_tiny_hybrid, make_tiny_windowed

ROOT = Path(__file__).resolve().parents[1]
KIND_CLASSES = {"StatePool", "WindowPool", "NoModelState"}
IMPLEMENTATIONS = {
    ROOT / "runtime/runner" / f
    for f in ("model_state.py", "state_pool.py", "window_pool.py", "state_kinds.py")
}
STATE_ATTRS = {"state_pool"}  # where the runner keeps its ModelState


def _is_state(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in STATE_ATTRS


def branches(source: str) -> list[tuple[int, str]]:
    """(line, code) of every place in ``source`` that asks which kind of model state it has."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id in KIND_CLASSES:
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.alias) and node.name.split(".")[-1] in KIND_CLASSES:
            found.append((node.lineno, f"import {node.name}"))
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
            and node.args and _is_state(node.args[0])
        ):  # fmt: skip
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Compare) and any(isinstance(op, ast.Is | ast.IsNot) for op in node.ops):
            if any(_is_state(x) for x in [node.left, *node.comparators]):
                found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_nothing_outside_the_implementations_asks_which_kind_of_state():
    bad = {}
    for folder in ("runtime", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path in IMPLEMENTATIONS:
                continue
            hits = branches(path.read_text())
            if hits:
                bad[str(path.relative_to(ROOT))] = hits
    assert bad == {}


# main's code before the interface (runtime/engine/states.py, engine.py, scoring.py, model_runner.py)
MAIN_BEFORE = """
from kvreuse.runtime.runner.window_pool import WindowPool
def store_budgets(runner, cfg):
    if not isinstance(runner.state_pool, WindowPool):
        return size, 0
def hybrid_states(runner, cfg):
    if runner.state_pool is None:
        return None, None
def set_chunk_size(self, tokens):
    ring_chunk = getattr(self.runner.state_pool, "max_chunk", tokens)
def forward(self, fb, states):
    if isinstance(self.state_pool, WindowPool):
        return self._window_forward(fb, states)
"""


def test_the_branches_of_main_are_found():
    assert [line for line, _ in branches(MAIN_BEFORE)] == [2, 4, 7, 10, 12]


def test_every_kind_is_a_model_state_with_its_facts(tmp_path):
    """Each registered kind builds a ``ModelState`` that answers every abstract method and fact."""
    configs = {
        "recurrent": ModelConfig.from_dir(make_tiny_hybrid(tmp_path / "h", "gqa-3to1-untied")),
        "window": ModelConfig.from_dir(make_tiny_windowed(tmp_path / "w", "gemma3-odd")),
    }
    configs["none"] = configs["window"]
    chosen = {
        "recurrent": state_kinds.state_kind(configs["recurrent"], True, True).name,
        "window": state_kinds.state_kind(configs["window"], True, True).name,
        "none": state_kinds.state_kind(configs["window"], False, True).name,
    }
    assert chosen == {"recurrent": "recurrent", "window": "window", "none": "none"}
    assert state_kinds.state_kind(configs["window"], True, one_device=False).name == "none"
    for name, kind in state_kinds.KINDS.items():
        shape = state_kinds.StateShape(configs[name], 2, 4, 16, torch.float32, torch.device("cpu"))
        state = kind.build(shape)
        assert isinstance(state, ModelState)
        for fact in ("keeps_snapshots", "rolls_back", "decode_graphs", "snapshot_store_share", "splice_span"):
            getattr(state, fact)
        slots = [state.alloc() for _ in range(max(1, state.num_slots))]
        for s in slots:
            state.free(s)
        assert state.num_free >= 1 and state.chunk_limit(8) <= 8
    with pytest.raises(NotImplementedError):
        state_kinds.KINDS["none"].build(shape).empty_snapshot()
