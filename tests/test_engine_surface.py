"""Engine's public surface (issue 52): what a caller needs (requests in, the step loop, abort, stats,
construction and close) and the components that own the rest (the cache manager: pins, tiers,
integrity; admission: a request's checks and capacities; the runner and scheduler, which benchmarks
and tests read as instrumentation), and a step that is a short loop.  A new public member has to be
added to the allow-list here, on purpose.  Main before issue 52 had 34 public methods and properties,
13 public attributes and a 20-line step; these tests fail on it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "runtime/engine/engine.py"

METHODS = {
    "make_request", "submit", "abort",  # add: build (the caller can refuse it before queuing), queue
    "step", "has_work", "generate", "call_between_steps",  # the loop; generate: the offline convenience
    "stats", "load",  # figures: totals, and a router's poll
    "prompt_logprobs", "reset_prefix_cache",  # between steps (echo logprobs, a cache reset)
    "close",
}  # fmt: skip
ATTRIBUTES = {
    "config", "tokenizer", "model_config", "model_dir", "model_name", "dtype", "device", "eos_ids", "max_model_len",
    "cache", "admission", "scheduler", "runner",  # the components that own the rest
}  # fmt: skip


def surface(source: str) -> tuple[set[str], set[str], int]:
    """Engine's public methods/properties, public attributes set in ``__init__``, and ``step``'s lines."""
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Engine")
    funcs = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    methods = {name for name in funcs if not name.startswith("_")}
    attrs = {
        n.attr
        for n in ast.walk(funcs["__init__"])
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
        and isinstance(n.value, ast.Name) and n.value.id == "self" and not n.attr.startswith("_")
    }  # fmt: skip
    step = funcs["step"]
    body = step.body[1:] if isinstance(step.body[0], ast.Expr) else step.body  # without the docstring
    return methods, attrs, body[-1].end_lineno - body[0].lineno + 1


def test_engine_public_members_are_the_allow_list():
    methods, attrs, _ = surface(ENGINE.read_text())
    assert methods == METHODS
    assert attrs == ATTRIBUTES
    assert len(methods) + len(attrs) == 25


def test_step_is_a_short_loop():
    """inbox -> schedule -> run the batch (forward, commit, detokenise): the rest is delegated."""
    assert surface(ENGINE.read_text())[2] <= 6


def test_the_engine_builds_with_that_surface(tmp_path):
    """The allow-list is what a built engine has (no public member added elsewhere, e.g. by a mixin)."""
    from tests.engine_drive import tiny_engine
    from tests.helpers import make_tiny_model

    eng = tiny_engine(make_tiny_model(tmp_path / "m", "llama"))
    public = {n for n in dir(eng) if not n.startswith("_")}
    assert public == METHODS | ATTRIBUTES
