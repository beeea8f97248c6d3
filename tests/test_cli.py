"""The CLI: help on every command, a completion on a tiny model, one-line errors for bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import make_tiny_model


def kvreuse(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvreuse.runtime.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
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


HELP_NEEDLES = {
    (): ["generate", "chat", "serve", "bench", "template-check", "top"],
    ("generate",): ["--prompt", "--max-tokens", "--page-size", "--prefix-cache", "(default 16)"],
    ("chat",): ["--system", "--chat-template", "--schedule-policy"],
    ("serve",): ["--port", "--max-waiting", "--kv-cache-memory", "--no-ui", "--ui-history"],
    ("top",): ["--url", "--api-key", "--interval", "--once"],
    ("bench",): ["patterns", "throughput", "ttft", "overhead"],
    ("template-check",): ["--chat-template", "--keep-reasoning"],
}


@pytest.mark.parametrize("cmd", list(HELP_NEEDLES))
def test_help_on_every_command(cmd):
    r = kvreuse(*cmd, "--help")
    assert r.returncode == 0, r.stderr
    text = r.stdout + r.stderr
    assert "usage" in text.lower()
    for needle in HELP_NEEDLES[cmd]:  # each command's own options, not a generic usage line
        assert needle in text, f"{cmd}: {needle!r} missing from help"


def test_generate_on_tiny_model(tiny):
    from kvreuse.runtime import Engine, SamplingParams

    r = kvreuse("generate", "--model", str(tiny), "--prompt", "hello there", "--max-tokens", "5")
    assert r.returncode == 0, r.stderr
    # the same greedy completion, computed in-process
    eng = Engine(model=str(tiny), kv_cache_memory="8M")  # the CLI's dtype and device defaults
    want = eng.generate("hello there", SamplingParams(max_tokens=5))[0]
    assert len(want.output_token_ids) == 5
    assert r.stdout == want.text + "\n"


def test_template_check_through_the_cli():
    # the CLI hands template-check the embedded model (chat_templates itself knows no model source)
    ok = kvreuse("template-check", "--chat-template", "chatml")
    assert ok.returncode == 0, ok.stderr
    assert "0 break(s)" in ok.stdout and "template: chatml" in ok.stdout
    broken = kvreuse("template-check", "--chat-template", "qwen3")
    assert broken.returncode == 1 and "BREAK at token" in broken.stdout


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


def test_max_model_len_beyond_the_model_is_refused(tiny):
    # positions past the model's context have no rotary embedding: refuse instead of failing mid-request
    r = kvreuse("generate", "--model", str(tiny), "--prompt", "hi", "--max-model-len", "1024")
    assert_one_line_error(r, "--max-model-len 1024", "context length (256 tokens)")
