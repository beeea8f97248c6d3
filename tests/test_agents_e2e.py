"""Issue 56: the real agent CLIs (Claude Code, Codex CLI; `make agents` installs them pinned) complete a
tool-using session against a real `kvreuse serve` with scripted replies: every reply's tokens forced
through the engine, the tools really run in a scratch repository, and the server's cache reuses each
request's prefix.  Skipped only where node or the CLIs are missing (`make test` installs them)."""

from __future__ import annotations

import shutil

import pytest

from kvreuse.benchmarks.agents.analyze import summary
from kvreuse.benchmarks.agents.session import AGENTS, AGENTS_DIR, PAGE, installed, run_session

pytestmark = pytest.mark.timeout(900)


@pytest.mark.parametrize("name", list(AGENTS))
def test_agent_runs_a_scripted_tool_session_on_kvreuse(name, tmp_path):
    if shutil.which("node") is None:
        pytest.skip("node is missing: `make agents` installs node and the agent CLIs")
    if installed(AGENTS[name]) is None:
        pytest.skip(f"{AGENTS_DIR / AGENTS[name].binary} is missing: run `make agents`")
    s = run_session(AGENTS[name], tmp_path, timeout_s=300, log=lambda _: None, n_tasks=1)
    assert s["runs"][0]["rc"] == 0, s["runs"]
    assert "+    return a + b" in s["repo_diff"]  # the scripted Edit / sed really ran in the repository
    assert all(r["status"] == 200 for r in s["records"]), [(r["path"], r["status"]) for r in s["records"]]
    got = summary(s, PAGE)
    main = [r for r in got["rows"] if r["kind"] == "main"]
    # 11 steps of task 1, each a model request, in the script's order: the agent ran every tool call
    assert [r["reply"] for r in main] == [f"step {k}" for k in range(11)]
    assert "Fixed: add() subtracted" in s["runs"][0]["output_tail"]
    for r in main[1:]:  # each request reuses the previous one's prefix: all but the tail of its last reply
        assert (
            r["cached_tokens"] >= r["ideal_cached"] - 8 * PAGE
            and r["cached_tokens"] > 0.9 * r["prompt_tokens"]
        )
    assert all(r["cause"] not in (None, "append_only") for r in got["rows"] if r["deficit"] > PAGE)


def test_the_report_section_reads_the_kept_recordings():
    """`make run`'s report needs no node: its Real agents section comes from the kept recordings, whose
    every deficit over a page carries a named break and whose cache-on replay matched the live server."""
    import json

    from kvreuse.benchmarks.agents.report import RESULTS, section

    lines = "\n".join(section())
    assert "## Real agents (scripted)" in lines
    for name, s in json.loads((RESULTS / "summary.json").read_text()).items():
        assert s["model_requests"] >= 10 and s["unexplained_breaks"] == 0, name
        assert s["replay"]["cache_on"]["matches_live"] == len(s["replay"]["cache_on"]["rows"]), name
        assert s["replay"]["cache_off"]["prefilled_tokens"] == s["prompt_tokens"], (
            name
        )  # cache off: all prefilled
        assert f"| {name} |" in lines
