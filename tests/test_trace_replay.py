"""The Mooncake trace replayer's token-level mode agrees with a real ``kvreuse serve`` request by request.

A short Mooncake-format trace (shared documents coming back over several turns, one-off requests
between them, more than the pool holds) is materialised into token ids and sent, one request at
a time, to a server running a tiny random model with a small pool; the server's own
``cached_tokens`` for each request must equal what ``benchmarks/traces/belady.py``'s replay of the same
requests (same pool, page size, chunk size and eviction policy) computes.  The rule of
``benchmarks/traces/eviction_traces.py``'s engine check, through the HTTP server.
"""

from __future__ import annotations

import random

import httpx
import pytest

from kvreuse.benchmarks.traces import mooncake
from kvreuse.benchmarks.traces.belady import replay
from kvreuse.runtime.cache.eviction import DEFAULT_POLICY
from kvreuse.runtime.server.launcher import ServerProcess
from tests.helpers import make_tiny_model

PAGE, CHUNK, UNIT, VOCAB = 16, 64, 16, 512  # a 512-token block is 32 tokens here


def small_trace() -> list[mooncake.TraceRequest]:
    """Four documents asked about over several turns, with one-off requests scanning between them."""
    rng = random.Random(5)
    docs = [list(range(100 * d, 100 * d + rng.randrange(3, 6))) for d in range(4)]
    reqs, t, one_off = [], 0.0, 1000
    for _ in range(4):  # turns
        for blocks in docs:
            if rng.random() < 0.8:
                n = len(blocks) * mooncake.BLOCK - rng.randrange(0, 400)  # the last block partly filled
                reqs.append(mooncake.TraceRequest(t, n, rng.randrange(16, 96), tuple(blocks)))
                t += rng.expovariate(1 / 500)
            if rng.random() < 0.5:
                reqs.append(mooncake.TraceRequest(t, 2 * mooncake.BLOCK, 32, (one_off, one_off + 1)))
                one_off += 2
                t += rng.expovariate(1 / 500)
    return reqs


def test_halves_split_by_time_and_loader_errors(tmp_path):
    reqs = small_trace()
    first, second = mooncake.halves(reqs)
    assert first and second and len(first) + len(second) == len(reqs)
    assert max(r.timestamp_ms for r in first) < min(r.timestamp_ms for r in second)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: not a Mooncake trace line"):
        mooncake.load(bad)
    with pytest.raises(FileNotFoundError, match="--trace"):
        mooncake.load(tmp_path / "missing.jsonl")


def test_materialised_blocks_share_exactly_the_trace_blocks():
    a = mooncake.TraceRequest(0, 3 * 512, 8, (1, 2, 3))
    b = mooncake.TraceRequest(1, 3 * 512 - 100, 8, (1, 2, 4))
    (pa, _), (pb, _) = mooncake.materialise([a, b], unit=16)
    assert len(pa) == 96 and len(pb) == -(-(3 * 512 - 100) // 16)
    assert pa[:64] == pb[:64] and pa[64] != pb[64]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trace_server")
    model = make_tiny_model(tmp / "tiny", vocab=VOCAB)
    # 2 layers x K,V x 2 KV heads x 16 dims x 4 bytes = 512 bytes a token: 40 pages of 16
    args = ["--model", str(model), "--dtype", "float32", "--device", "cpu", "--page-size", str(PAGE),
            "--chunk-size", str(CHUNK), "--kv-cache-memory", str(40 * PAGE * 512), "--max-running", "1"]  # fmt: skip
    proc = ServerProcess(args, tmp / "server.log").start()
    yield proc
    proc.stop()


def test_token_level_replay_matches_the_servers_cached_tokens(server):
    trace = mooncake.materialise(small_trace(), unit=UNIT, vocab=VOCAB)
    pool = httpx.get(f"{server.url}/debug/kv", timeout=30).json()["pages"]["total_pages"]
    served = []
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        for prompt, output in trace:
            body = {"prompt": prompt, "max_tokens": len(output), "ignore_eos": True, "temperature": 0}
            r = client.post("/completions", json=body)
            assert r.status_code == 200, r.text
            usage = r.json()["usage"]
            assert usage["completion_tokens"] == len(output)
            served.append(usage["prompt_tokens_details"]["cached_tokens"])
    # the outputs differ (the model's vs the trace's) but no later prompt contains them: same pages, same hits
    token_level = replay(trace, pool, PAGE, DEFAULT_POLICY, chunk_size=CHUNK)
    assert sum(served) > 0 and served != [0] * len(served)
    unbounded = replay(trace, 10_000, PAGE, DEFAULT_POLICY, chunk_size=CHUNK)
    assert sum(token_level) < sum(unbounded), "the pool must be too small to keep everything"
    assert served == token_level
