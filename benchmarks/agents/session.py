"""One agent session against a real ``kvreuse serve``: a scratch repository, a server forcing the
agent's scripted replies and recording every exchange, and the agent CLI run as a subprocess (loopback
only), task after task.  The recording comes back scrubbed of the machine's paths.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from kvreuse.benchmarks.agents import tasks
from kvreuse.benchmarks.agents.model import agent_model_dir
from kvreuse.runtime.server.launcher import ServerProcess

AGENTS_DIR = Path(__file__).resolve().parents[2] / ".agents" / "node_modules" / ".bin"
# Sessions run in a fixed folder, so recordings name no machine's paths and replay token for token
# (a path rewritten afterwards would change the prompts' token counts); a test's own folder is scrubbed
# to these names.
WORK = Path("/tmp/kvreuse-agents")
SERVED = "kvreuse-tiny"
PAGE = 16


class Agent(NamedTuple):
    """An agent CLI: its binary, its scripted steps, its task invocations and its environment."""

    name: str
    binary: str
    steps: Callable[[str], list[dict[str, Any]]]
    argv: Callable[[Path, str, bool], list[str]]  # (binary, prompt, continue the last session?)
    env: Callable[[str, Path], dict[str, str]]  # (server url, home)
    setup: Callable[[str, Path], None]  # writes its config under home


def _claude_argv(binary: Path, prompt: str, cont: bool) -> list[str]:
    return [str(binary), "-p", prompt, "--model", "claude-sonnet-4-5", *(["--continue"] if cont else []),
            "--allowedTools", "Read,Bash,Edit,Grep,Write"]  # fmt: skip


# Claude Code 2.1.x compacts ahead of the API's "prompt too long" only where the compaction window
# is configured (its source not "auto": CLAUDE_CODE_AUTO_COMPACT_WINDOW, at least 100,000); the
# threshold is then min(E * PCT / 100, E - 13,000) tokens where E = window - min(max output, 20,000):
# (100,000 - 20,000) * 40% = 32,000, which task 2's log reads cross (task 1 ends near 22,500).
COMPACT_ENV = {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "100000", "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "40"}


def _claude_env(url: str, home: Path) -> dict[str, str]:
    # the README's settings; no traffic beyond the server (no telemetry, no update check)
    return {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "sk-local",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", **COMPACT_ENV}  # fmt: skip


CODEX_CONFIG = """model = "{model}"
model_provider = "kvreuse"
# compaction at a threshold the bench's second task crosses (Codex's own default is the model's window)
model_auto_compact_token_limit = 12000

[model_providers.kvreuse]
name = "kvreuse"
base_url = "{url}/v1"
wire_api = "responses"
"""


def _codex_setup(url: str, home: Path) -> None:
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    (home / ".codex" / "config.toml").write_text(CODEX_CONFIG.format(model=SERVED, url=url))


def _codex_argv(binary: Path, prompt: str, cont: bool) -> list[str]:
    flags = ["--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
    return [str(binary), "exec", *(["resume", "--last"] if cont else []), *flags, prompt]


AGENTS = {
    "claude-code": Agent("claude-code", "claude", tasks.claude_steps, _claude_argv, _claude_env, lambda u, h: None),
    "codex": Agent("codex", "codex", tasks.codex_steps, _codex_argv,
                   lambda url, home: {"CODEX_HOME": str(home / ".codex")}, _codex_setup),
}  # fmt: skip


def installed(agent: Agent) -> Path | None:
    path = AGENTS_DIR / agent.binary
    return path if path.exists() and shutil.which("node") else None


def read_records(record: Path, repo: Path, home: Path, agent_name: str) -> list[dict]:
    """The server's ``--record`` file, one exchange a line, scrubbed of the session's paths."""
    lines = record.read_text().splitlines()
    return [json.loads(scrub(line, repo, home, agent_name)) for line in lines if line.strip()]


def scrub(text: str, repo: Path, home: Path, name: str = "agent") -> str:
    return text.replace(str(repo), str(WORK / name / "repo")).replace(str(home), str(WORK / name / "home"))


def serve_args(script: Path) -> list[str]:
    """``kvreuse serve`` arguments of a scripted session (also what a replay's server needs to give
    the live session's replies and cache figures)."""
    return ["--model", str(agent_model_dir()), "--chat-template", "qwen3", "--served-model-name", SERVED,
            "--kv-cache-memory", "512M", "--max-model-len", "65536", "--page-size", str(PAGE),
            "--script", str(script)]  # fmt: skip


def run_session(agent: Agent, work: Path | None = None, timeout_s: float = 300.0,
                log: Callable[[str], None] = print, server_args: tuple[str, ...] = (), n_tasks: int = 2) -> dict[str, Any]:  # fmt: skip
    """Both tasks, one server; returns {"script", "records" (scrubbed), "runs" (per task: rc, tail)}."""
    binary = installed(agent)
    if binary is None:
        raise FileNotFoundError(f"{agent.name}: {AGENTS_DIR / agent.binary} or node missing (make agents)")
    if work is None:
        work = WORK / agent.name
        shutil.rmtree(work, ignore_errors=True)
    repo, home = tasks.make_repo(work / "repo"), work / "home"
    home.mkdir(parents=True, exist_ok=True)
    script, record = work / "script.json", work / "record.jsonl"
    script.write_text(json.dumps(tasks.script(agent.name, str(repo))))
    args = [*serve_args(script), "--record", str(record), *server_args]
    server = ServerProcess(args, work / "server.log").start()
    runs = []
    try:
        agent.setup(server.url, home)
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "LANG": "C.UTF-8",
               **agent.env(server.url, home)}  # fmt: skip
        for k, prompt in enumerate((tasks.PROMPT_1, tasks.PROMPT_2)[:n_tasks]):
            log(f"{agent.name}: task {k + 1}")
            try:
                p = subprocess.run(agent.argv(binary, prompt, k > 0), cwd=repo, env=env, stdin=subprocess.DEVNULL,
                                   capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
                rc, out = p.returncode, p.stdout + p.stderr
            except subprocess.TimeoutExpired as e:
                rc, out = (
                    124,
                    (e.stdout or b"").decode(errors="replace")
                    if isinstance(e.stdout, bytes)
                    else str(e.stdout or ""),
                )
            runs.append({"task": k + 1, "rc": rc, "output_tail": scrub(out[-1500:], repo, home, agent.name)})
    finally:
        server.terminate()
    records = read_records(record, repo, home, agent.name)
    return {"agent": agent.name, "script": json.loads(scrub(script.read_text(), repo, home, agent.name)),
            "records": [r for r in records if r["path"] != "/health"], "runs": runs,
            "repo_diff": scrub(subprocess.run(["git", "diff"], cwd=repo, capture_output=True, text=True).stdout, repo, home, agent.name)}  # fmt: skip
