"""Cached replies written by one extend step give the same cache as forced decoding, request by request.

The agent-scale session, the cache-off contrasts, the status sweep and Experiment 2-3 write each reply's
KV with one extend step (``InProcessTarget(reply_kv="extend")``) instead of one decode step per token;
this is what makes them affordable on a CPU, and it is only honest if the counts are the decode path's.
"""

from __future__ import annotations

import argparse

import pytest

from kvreuse.benchmarks.patterns import PATTERNS
from kvreuse.benchmarks.patterns.run import run_pattern
from kvreuse.benchmarks.patterns.sections import engine_for
from kvreuse.benchmarks.patterns.stacks import STACKS
from kvreuse.benchmarks.patterns.targets import InProcessTarget
from kvreuse.benchmarks.workloads import load

FIELDS = (
    "prompt_tokens",
    "cached_tokens",
    "prefilled_tokens",
    "generated_tokens",
    "ideal_tokens",
    "divergence",
)


@pytest.fixture(scope="module")
def engine():
    return engine_for("qwen3", argparse.Namespace(page_size=16))


@pytest.mark.parametrize(
    "name", ["append_only", "status_replace", "sliding_window", "timestamp_end", "text_stable"]
)
def test_extend_writes_the_same_cache_as_decoding(engine, name):
    traj, stack = load("coding", "quick"), STACKS["qwen3-append"]
    rows = {}
    for mode in ("decode", "extend"):
        target = InProcessTarget(engine, max_tokens=2, reply_kv=mode)
        run = run_pattern(target, engine.tokenizer, PATTERNS[name], traj, lambda row: None, 16, stack=stack)
        rows[mode] = [{f: r[f] for f in FIELDS} for r in run["requests"]]
    assert rows["extend"] == rows["decode"]
    assert sum(r["cached_tokens"] for r in rows["decode"]) > 0
