"""Issue 56: a kept agent recording replays against a running ``kvreuse serve`` (``kvreuse bench
agents --analyse-only --server URL``): the recorded bodies sent again to ``/v1/responses`` and
``/v1/messages`` find, with the cache on, the live session's prompt and cached tokens on every
request (the server runs the session's model, template and script, so its replies are the live
ones), and with the cache reset before each request, nothing cached.  No node needed: the recordings
are committed (benchmarks/results/agents)."""

from __future__ import annotations

import json

import pytest

from kvreuse.benchmarks.agents.analyze import chat_records
from kvreuse.benchmarks.agents.replay_server import replay_server, write_script
from kvreuse.benchmarks.agents.report import RESULTS
from kvreuse.benchmarks.agents.session import serve_args
from kvreuse.runtime.server.launcher import ServerProcess

pytestmark = pytest.mark.timeout(900)


@pytest.mark.parametrize("agent", ["codex", "claude-code"])
def test_a_kept_recording_replays_against_a_server_as_live(agent, tmp_path):
    session = json.loads((RESULTS / f"{agent}.json").read_text())
    server = ServerProcess(
        serve_args(write_script(session, tmp_path / "script.json")), tmp_path / "server.log"
    )
    server.start()
    try:
        out = replay_server(session, server.url)
    finally:
        server.terminate()
    on, off = out["cache_on"], out["cache_off"]
    live = [(r["result"]["kvreuse"]["cache"]["prompt_tokens"], r["result"]["kvreuse"]["cache"]["cached_tokens"])
            for r in chat_records(session["records"])]  # fmt: skip
    assert on["errors"] == off["errors"] == 0
    assert [(r["prompt_tokens"], r["cached_tokens"]) for r in on["rows"]] == live
    assert on["cached_tokens"] == sum(c for _, c in live) > 0
    assert all(r["cached_tokens"] == 0 for r in off["rows"])
    assert off["prefilled_tokens"] == sum(p for p, _ in live)
