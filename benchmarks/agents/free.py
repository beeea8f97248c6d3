"""Free mode: an agent on the real Gemma 3 270M (32K context) with the model's own replies, one task.
What it shows: the agent's requests run to the agent's end without a server error (a 270M model
rarely calls a tool; its words are its own).  Its figures are not comparable to the scripted ones."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from kvreuse.benchmarks.agents import tasks
from kvreuse.benchmarks.agents.analyze import chat_records, rows
from kvreuse.benchmarks.agents.session import PAGE, WORK, Agent, installed, read_records, scrub
from kvreuse.runtime.server.launcher import ServerProcess

MODEL = "gemma-3-270m"


def run_free(agent: Agent, timeout_s: float = 600.0) -> dict[str, Any]:
    binary = installed(agent)
    assert binary is not None
    work = WORK / f"free-{agent.name}"
    shutil.rmtree(work, ignore_errors=True)
    repo, home = tasks.make_repo(work / "repo"), work / "home"
    home.mkdir()
    record = work / "record.jsonl"
    args = ["--model", MODEL, "--chat-template", "gemma3", "--served-model-name", "kvreuse-tiny", "--kv-cache-memory", "1G",
            "--max-model-len", "32768", "--page-size", str(PAGE), "--record", str(record)]  # fmt: skip
    server = ServerProcess(args, work / "server.log").start(timeout=600)
    try:
        agent.setup(server.url, home)
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(home),
            "LANG": "C.UTF-8",
            **agent.env(server.url, home),
        }
        try:
            p = subprocess.run(agent.argv(binary, tasks.PROMPT_1, False), cwd=repo, env=env, stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
            rc, out = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired:
            rc, out = 124, ""
    finally:
        server.terminate()
    records = read_records(record, repo, home, agent.name)
    records = [r for r in records if r["path"] != "/health"]
    return {"agent": agent.name, "model": MODEL, "mode": "free", "rc": rc, "output_tail": scrub(out[-800:], repo, home, agent.name),
            "http_statuses": [r["status"] for r in records], "server_errors": sum(r["status"] >= 500 or (r["status"] == 200 and "error" in r["result"]) for r in records),
            "refusals": [r["result"].get("error", {}).get("message") for r in records if 400 <= r["status"] < 500],
            "model_requests": len(chat_records(records)), "rows": rows(records, PAGE)}  # fmt: skip
