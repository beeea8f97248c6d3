"""The CLI: help on every command, a completion on a tiny model, one-line errors for bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import make_tiny_model


def kvreuse(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("kvreuse: error:")]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(
        tmp_path_factory.mktemp("cli") / "m", "llama", vocab=49152, max_position_embeddings=256
    )


@pytest.mark.parametrize("cmd", [[], ["generate"], ["chat"], ["serve"], ["bench"], ["template-check"]])
def test_help_on_every_command(cmd):
    r = kvreuse(*cmd, "--help")
    assert r.returncode == 0, r.stderr
    assert "usage" in (r.stdout + r.stderr).lower()


def test_generate_on_tiny_model(tiny):
    r = kvreuse("generate", "--model", str(tiny), "--prompt", "hello there", "--max-tokens", "5")
    assert r.returncode == 0, r.stderr


def test_unknown_model_path():
    assert_one_line_error(
        kvreuse("generate", "--model", "/no/such/model", "--prompt", "hi"), "/no/such/model"
    )


def test_corrupt_weights(tiny, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((tiny / "config.json").read_text())
    (bad / "model.safetensors").write_bytes(b"\x00garbage" * 100)
    assert_one_line_error(kvreuse("generate", "--model", str(bad), "--prompt", "hi"), "model.safetensors")


def test_prompt_longer_than_context(tiny):
    r = kvreuse("generate", "--model", str(tiny), "--prompt", "word " * 400, "--max-tokens", "4")
    assert_one_line_error(r, "context length (256 tokens)", "max_tokens (4)")


def test_prompt_longer_than_kv_budget(tiny):
    # 2 layers x 2 kv heads x 16 dims x fp32 x K/V = 512 bytes/token: 32K holds 64 tokens
    r = kvreuse("generate", "--model", str(tiny), "--prompt", "word " * 100, "--kv-cache-memory", "32K")
    assert_one_line_error(r, "exceeds the KV cache", "--kv-cache-memory")


def test_bad_flag_values(tiny):
    assert_one_line_error(
        kvreuse("generate", "--model", str(tiny), "--prompt", "x", "--page-size", "0"), "page_size"
    )
    r = kvreuse("generate", "--model", str(tiny), "--prompt", "x", "--kv-cache-memory", "lots")
    assert_one_line_error(r, "lots")
