"""Issue 12 acceptance: schemathesis (every check) against a real server's /openapi.json, bounded:
no response >= 500, no request left without a response, and the server still serves at the end.
The recorded bigger run is ``python -m tests.fuzz_server`` (benchmarks/results/fuzz_server.json).

The server here serves a tiny random llama with the embedded model's tokenizer, chat template and
vocabulary (same loader, engine and HTTP code as the embedded SmolLM2): decoding the embedded model to
the 64-token context was ~80% of these tests' time, and no check here depends on what is generated.
The recorded run keeps the embedded model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("schemathesis")

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from tests.helpers import embedded_dir, make_tiny_model

    # the tokenizer's whole vocabulary, so every prompt token id is in range
    vocab = json.loads((embedded_dir() / "config.json").read_text())["vocab_size"]
    return make_tiny_model(tmp_path_factory.mktemp("fuzz") / "m", "llama", tie=True, vocab=vocab)


@pytest.mark.parametrize("keys", [False, True], ids=["open", "keys"])
def test_schemathesis_finds_no_server_error_and_no_hang(tmp_path, model, keys):
    from tests.fuzz_server import run

    result = run(max_examples=3, log_dir=tmp_path, keys=keys, model=model)
    assert result["requests"] > 100, result
    assert result["responses_5xx"] == 0 and result["no_response"] == 0, result
    assert result["alive_at_end"], result
    assert result["server_exit_code_running"] is None  # still up, not restarted


def test_schemathesis_on_the_responses_routes_finds_no_server_error(tmp_path, model):
    """Issue 35: the Responses routes alone, with more examples each."""
    from tests.fuzz_server import run

    result = run(max_examples=15, log_dir=tmp_path, paths="^/v1/responses", model=model)
    assert result["requests"] > 100, result
    assert result["responses_5xx"] == 0 and result["no_response"] == 0, result
    assert result["alive_at_end"], result
