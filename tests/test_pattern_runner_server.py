"""``--server`` parity: the same tiny workload through kvreuse's own server and in-process gives the same
token accounting (prompt, cached and prefilled tokens per request), so peers can be measured alike."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from kvreuse.benchmarks.patterns import PATTERNS
from kvreuse.benchmarks.workloads import Turn
from tests.test_patterns import tiny_trajectory

NAMES = ["append_only", "timestamp_end", "naive"]


def four_turns():
    """The tiny trajectory plus a fourth turn, so every pattern has three requests after the first."""
    traj = tiny_trajectory()
    extra = Turn(
        0, [{"role": "user", "content": "And chargebacks?"}], {"role": "assistant", "content": "In cb.py."}
    )
    return type(traj)(traj.name, traj.variant, traj.seed, traj.system, traj.tools, [*traj.turns, extra])


def measure(target, tokenizer, traj):
    from kvreuse.benchmarks.patterns.run import run_pattern

    # an OpenAI API cannot force a reply, so both sides replay the replies (the first edition's mode)
    return {
        n: run_pattern(target, tokenizer, PATTERNS[n], traj, lambda row: None, 16, replies="replayed")
        for n in NAMES
    }


def counts(run):
    keys = ("prompt_tokens", "rendered_tokens", "cached_tokens", "prefilled_tokens")
    return [tuple(row[k] for k in keys) for row in run["requests"]]


@pytest.mark.slow
def test_server_target_accounts_like_the_in_process_engine(tmp_path):
    from kvreuse.benchmarks.patterns.targets import InProcessTarget, ServerTarget
    from kvreuse.runtime.engine.engine import Engine
    from kvreuse.runtime.server.launcher import ServerProcess

    traj = four_turns()
    args = ["--chat-template", "qwen3", "--kv-cache-memory", "256M", "--page-size", "16"]
    # the in-process engine loads while the server process starts: the two overlap
    with ThreadPoolExecutor(1) as pool:
        loading = pool.submit(Engine, None, page_size=16, kv_cache_memory="256M")
        server = ServerProcess(args, tmp_path / "server.log").start()
    try:
        engine = loading.result()
        remote = measure(ServerTarget(server.base_url, max_tokens=2), engine.tokenizer, traj)
    finally:
        server.stop()
    local = measure(InProcessTarget(engine, max_tokens=2), engine.tokenizer, traj)
    for name in NAMES:
        assert counts(remote[name]) == counts(local[name]), name
        for row in remote[name]["requests"]:
            assert row["prompt_tokens"] == row["rendered_tokens"]  # the server rendered what we account for
    # the runs measured something: reuse where the pattern allows it, none with the cache off
    assert local["append_only"]["totals"]["cached_tokens"] > 0
    assert local["naive"]["totals"]["cached_tokens"] == 0
    ts = local["timestamp_end"]["totals"]
    assert 0 < ts["cached_tokens"] < local["append_only"]["totals"]["cached_tokens"]
