"""Free mode: an agent on the real Gemma 3 270M (32K context) with the model's own replies, one task.
What it shows: the agent's requests run to the agent's end without a server error (a 270M model
rarely calls a tool; its words are its own).  Its figures are not comparable to the scripted ones.

Bounded: the server caps every reply at ``CAP`` tokens (``--max-tokens-cap``, llama.cpp's server
``--n-predict``; each capped reply says so in ``usage.max_tokens_clamped``): Gemma 3 270M on two CPU
cores decodes a few tokens a second at a 20K-token context and rarely stops by itself, so the
32,000 Claude Code asks for (clamped to the context's 7,800 left) outlasted the agent's 300 s.
Gemma's template requires alternating roles: the server merges Codex's consecutive developer/user
messages (``chat_templates/alternation.py``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Any

from kvreuse.benchmarks.agents import tasks
from kvreuse.benchmarks.agents.analyze import chat_records, rows
from kvreuse.benchmarks.agents.session import PAGE, WORK, Agent, installed, read_records, scrub
from kvreuse.runtime.server.launcher import ServerProcess

MODEL = "gemma-3-270m"
CAP = 256  # tokens per reply (--max-tokens-cap)


def run_free(agent: Agent, timeout_s: float = 600.0) -> dict[str, Any]:
    binary = installed(agent)
    assert binary is not None
    work = WORK / f"free-{agent.name}"
    shutil.rmtree(work, ignore_errors=True)
    repo, home = tasks.make_repo(work / "repo"), work / "home"
    home.mkdir()
    record = work / "record.jsonl"
    args = ["--model", MODEL, "--chat-template", "gemma3", "--served-model-name", "kvreuse-tiny", "--kv-cache-memory", "1G",
            "--max-model-len", "32768", "--page-size", str(PAGE), "--record", str(record),
            "--max-tokens-cap", str(CAP)]  # fmt: skip
    server = ServerProcess(args, work / "server.log").start(timeout=600)
    try:
        agent.setup(server.url, home)
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(home),
            "LANG": "C.UTF-8",
            **agent.env(server.url, home),
        }
        t0 = time.perf_counter()
        try:
            p = subprocess.run(agent.argv(binary, tasks.PROMPT_1, False), cwd=repo, env=env, stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
            rc, out, answer = p.returncode, p.stdout + p.stderr, p.stdout
        except subprocess.TimeoutExpired:
            rc, out, answer = 124, "", ""
        wall = time.perf_counter() - t0
    finally:
        server.terminate()
    records = read_records(record, repo, home, agent.name)
    records = [r for r in records if r["path"] != "/health"]
    chats = chat_records(records)
    capped = sum(
        ((r["result"].get("kvreuse") or {}).get("max_tokens_clamped") or {}).get("by") == "cap" for r in chats
    )
    return {"agent": agent.name, "model": MODEL, "mode": "free", "max_tokens_cap": CAP, "capped_replies": capped,
            "stop_reasons": [r["result"].get("stop_reason") or r["result"].get("status") for r in chats], "wall_s": round(wall, 1), "rc": rc, "output_tail": scrub(out[-800:], repo, home, agent.name),
            "answer": scrub(answer[-400:], repo, home, agent.name),
            "http_statuses": [r["status"] for r in records], "server_errors": sum(r["status"] >= 500 or (r["status"] == 200 and "error" in r["result"]) for r in records),
            "refusals": [r["result"].get("error", {}).get("message") for r in records if 400 <= r["status"] < 500],
            "model_requests": len(chat_records(records)), "rows": rows(records, PAGE)}  # fmt: skip
