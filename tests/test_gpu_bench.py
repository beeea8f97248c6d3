"""The GPU benchmark's code path, run on CPU with its 2-layer smoke config (no timing claims)."""

from __future__ import annotations

import json

import pytest
import torch

from kvreuse.benchmarks.kernels import gpu_bench


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
def test_without_cuda_exits_with_one_line(capsys, tmp_path):
    out = tmp_path / "gpu.json"
    assert gpu_bench.main(["--out", str(out)]) == 2
    printed = capsys.readouterr()
    lines = (printed.out + printed.err).strip().splitlines()
    assert len(lines) == 1 and "no CUDA" in lines[0]
    assert not out.exists()


def test_cpu_smoke_runs_both_implementations_on_the_same_weights(tmp_path):
    out = tmp_path / "gpu.json"
    assert gpu_bench.main(["--cpu-smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert "skipped" in result["kernels"]
    m = result["models"]["smoke"]
    # same checkpoint, fp32: our engine and transformers agree on the logits of the first prompt
    assert m["check"]["max_abs_diff"] < 1e-4 < m["check"]["ref_max_abs"]
    assert m["check"]["argmax_equal"] and m["check"]["greedy_tokens_equal_batch0"]
    ours, theirs = m["kvreuse"], m["transformers"]
    for impl in (ours, theirs):
        assert [r["tokens"] for r in impl["prefill"]] == [16, 64]
        assert [r["batch"] for r in impl["decode"]] == [1, 4]
        assert all(r["tokens_per_s"] > 0 for r in impl["prefill"] + impl["decode"])
        assert all(len(r["tokens_batch0"]) == 6 for r in impl["decode"])
    # contexts 64 and 128 keep their first 3/4 (48 and 96 tokens: whole pages of 16) in the prefix cache
    assert [(r["context"], r["cached_tokens"]) for r in ours["ttft"]] == [(64, 48), (128, 96)]
    assert all(r["steps"] >= 1 for r in ours["decode"])
    # tied 512x64 embedding; per layer: 2 norms, q/k/v/o (4 heads of 16, 2 kv heads), q/k norms, MLP; final norm
    per_layer = 2 * 64 + 64 * (64 + 2 * 32) + 64 * 64 + 2 * 16 + 3 * 64 * 128
    assert m["params"] == 512 * 64 + 2 * per_layer + 64
