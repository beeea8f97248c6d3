"""Issue 12 acceptance: schemathesis (every check) against a real server's /openapi.json, bounded:
no response >= 500, no request left without a response, and the server still serves at the end.
The recorded bigger run is ``python -m tests.fuzz_server`` (benchmarks/results/fuzz_server.json)."""

from __future__ import annotations

import pytest

pytest.importorskip("schemathesis")

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


@pytest.mark.parametrize("keys", [False, True], ids=["open", "keys"])
def test_schemathesis_finds_no_server_error_and_no_hang(tmp_path, keys):
    from tests.fuzz_server import run

    result = run(max_examples=3, log_dir=tmp_path, keys=keys)
    assert result["requests"] > 100, result
    assert result["responses_5xx"] == 0 and result["no_response"] == 0, result
    assert result["alive_at_end"], result
    assert result["server_exit_code_running"] is None  # still up, not restarted


def test_schemathesis_on_the_responses_routes_finds_no_server_error(tmp_path):
    """Issue 35: the Responses routes alone, with more examples each."""
    from tests.fuzz_server import run

    result = run(max_examples=15, log_dir=tmp_path, paths="^/v1/responses")
    assert result["requests"] > 100, result
    assert result["responses_5xx"] == 0 and result["no_response"] == 0, result
    assert result["alive_at_end"], result
