"""Tensor parallelism on CPU (gloo, 2 ranks): TP=2 equals TP=1, token for token, cache accounting too.

The expected values are the single-device engine's (itself checked against transformers in
``test_model_parity.py``); both run the same prompts here.
"""

from __future__ import annotations

import time

import pytest
import torch

from kvreuse.runtime.runner.distributed.launch import TPError
from tests.engine_drive import assert_logits_close, generate_checked, greedy, random_ids, tiny_engine
from tests.helpers import make_tiny_model

ARCHS = [("llama", False), ("qwen2", True), ("qwen3", False)]


@pytest.fixture(scope="module", params=ARCHS, ids=lambda a: f"{a[0]}-{'tied' if a[1] else 'untied'}")
def pair(request, tiny_models):
    d = tiny_models[request.param]
    one = tiny_engine(d, record_logits=True, chunk_size=64)
    two = tiny_engine(d, record_logits=True, chunk_size=64, tensor_parallel_size=2)
    yield one, two
    two.close()


def test_logits_and_greedy_equal_single_device(pair):
    one, two = pair
    gen = torch.Generator().manual_seed(0)
    prompts = [random_ids(gen, n) for n in (1, 7, 31, 129, 300)]
    params = [greedy(64 if i == 2 else 4) for i in range(len(prompts))]
    a = generate_checked(one, prompts, params)
    b = generate_checked(two, prompts, params)  # batched together, chunked at 64: every path at once
    for x, y in zip(a, b):
        assert x.output_ids == y.output_ids
        assert_logits_close(x, y)


def test_prefix_cache_accounting_identical(pair):
    one, two = pair
    gen = torch.Generator().manual_seed(1)
    history: list[int] = []
    for turn in range(4):
        prompt = history + random_ids(gen, 20 + 7 * turn)
        ra = generate_checked(one, [prompt], [greedy(6)])[0]
        rb = generate_checked(two, [prompt], [greedy(6)])[0]
        assert (ra.cached_tokens, ra.prefilled_tokens, ra.output_ids) == (
            rb.cached_tokens,
            rb.prefilled_tokens,
            rb.output_ids,
        )
        assert turn == 0 or rb.cached_tokens > 0
        history = list(rb.tokens)


def test_fewer_kv_heads_than_ranks_are_replicated(tmp_path):
    d = make_tiny_model(tmp_path / "mqa", "llama", num_key_value_heads=1)
    one, two = tiny_engine(d, record_logits=True), tiny_engine(d, record_logits=True, tensor_parallel_size=2)
    try:
        p = random_ids(torch.Generator().manual_seed(2), 50)
        x, y = generate_checked(one, [p], [greedy(16)])[0], generate_checked(two, [p], [greedy(16)])[0]
        assert x.output_ids == y.output_ids
        assert_logits_close(x, y)
    finally:
        two.close()


def test_model_that_does_not_split_is_refused_before_spawning(tiny_models):
    with pytest.raises(ValueError, match="do not split over 3"):
        tiny_engine(tiny_models[("llama", False)], tensor_parallel_size=3)


def test_a_dead_rank_ends_the_run_with_an_error(tiny_models):
    eng = tiny_engine(tiny_models[("llama", False)], tensor_parallel_size=2)
    try:
        p = random_ids(torch.Generator().manual_seed(3), 30)
        eng.generate(p, greedy(2))
        eng.runner.workers.procs[0].kill()
        eng.runner.workers.procs[0].join(10)
        t0 = time.monotonic()
        with pytest.raises(TPError, match="rank 1 exited"):
            eng.generate(p, greedy(2))
        assert time.monotonic() - t0 < 30
    finally:
        eng.close()


def test_torchrun_launch_runs_every_rank_with_one_command(tmp_path):
    """``torchrun --nproc-per-node 2 -m kvreuse.runtime.cli.main generate --tensor-parallel-size 2``: rank 0 prints
    the completion the single-device engine prints, rank 1 serves its steps and exits 0."""
    import os
    import subprocess
    import sys

    d = str(make_tiny_model(tmp_path / "m", "llama", vocab=49152))  # the embedded tokenizer's vocabulary
    args = ["generate", "--model", d, "--dtype", "float32", "--prompt", "hello world", "--max-tokens", "8"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    single = subprocess.run(
        [sys.executable, "-m", "kvreuse.runtime.cli.main", *args], capture_output=True, text=True, env=env
    )
    assert single.returncode == 0, single.stderr
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "0",
         "-m", "kvreuse.runtime.cli.main", *args, "--tensor-parallel-size", "2"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == single.stdout.strip()


@pytest.mark.timeout(180)  # before the runner's one forward door, rank 0 scored alone and hung here
def test_prompt_logprobs_run_on_every_rank(pair):
    """Echo + logprobs scores a prompt between steps: under tensor parallelism every rank must run
    that forward (else rank 0 waits alone in the first all-reduce, or the ranks fall out of step)."""
    one, two = pair
    gen = torch.Generator().manual_seed(2)
    ids = random_ids(gen, 150)
    a, b = one.prompt_logprobs(ids, 3, chunk_size=64), two.prompt_logprobs(ids, 3, chunk_size=64)
    assert [t for t, _ in a] == [t for t, _ in b] == ids and a[0][1] is None is b[0][1]
    for (_, x), (_, y) in zip(a[1:], b[1:]):
        assert abs(x[0] - y[0]) < 1e-4 and [t for t, _ in x[1]] == [t for t, _ in y[1]]
    after = random_ids(gen, 40)  # the ranks are still in step: a generate after it matches TP=1
    assert generate_checked(one, [after], [greedy(8)])[0].output_ids == (
        generate_checked(two, [after], [greedy(8)])[0].output_ids
    )
