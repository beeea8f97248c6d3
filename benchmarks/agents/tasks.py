"""The scripted coding tasks: a scratch repository with a bug and its test, and per agent the tool
calls its replies make (in the agent's own tool names), ending in a text answer.

Task 1 (one agent invocation, 11 model requests): list the files, read the README, the code and the
test, run the test (it fails), search for the function, edit the bug, run the test again (it passes),
read the result, look at the diff, answer.  Task 2 (the session continued): read a long log file whose
output fills the context, then answer, so the agent's own compaction (where it has one, and a
threshold the bench sets low) runs on real traffic.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

FILES = {
    "README.md": "# calc\n\nA tiny calculator. `python3 test_calc.py` runs its test.\n",
    "calc.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
    "test_calc.py": "from calc import add, mul\n\nassert add(2, 3) == 5, add(2, 3)\nassert mul(2, 3) == 6\n"
    'print("ok")\n',
}
LOG_LINES = 1500  # build.log: ~30K characters of tool output for task 2


def make_repo(root: Path) -> Path:
    """A git repository with the task's files, committed (so ``git diff`` shows the agent's edit)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, text in FILES.items():
        (root / name).write_text(text)
    (root / "build.log").write_text(
        "".join(f"step {i}: compiled module_{i % 97}.o in {i % 13} ms\n" for i in range(LOG_LINES))
    )
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "start"], cwd=root, check=True)
    return root


PROMPT_1 = "The test in test_calc.py fails. Find the bug, fix it and check the test passes."
PROMPT_2 = "Now look at build.log and tell me whether the build finished."


def claude_steps(repo: str) -> list[dict[str, Any]]:
    """Claude Code's tools: Read (absolute paths), Edit (after a Read), Bash, Grep."""
    return [
        {"text": "Let me look at the repository.", "tool": "Bash", "input": {"command": "ls", "description": "List files"}},
        {"tool": "Read", "input": {"file_path": f"{repo}/README.md"}},
        {"tool": "Read", "input": {"file_path": f"{repo}/calc.py"}},
        {"tool": "Read", "input": {"file_path": f"{repo}/test_calc.py"}},
        {"tool": "Bash", "input": {"command": "python3 test_calc.py", "description": "Run the test"}},
        {"tool": "Grep", "input": {"pattern": "def add", "path": repo, "output_mode": "content"}},
        {"text": "add subtracts.", "tool": "Edit",
         "input": {"file_path": f"{repo}/calc.py", "old_string": "return a - b", "new_string": "return a + b"}},
        {"tool": "Bash", "input": {"command": "python3 test_calc.py", "description": "Run the test again"}},
        {"tool": "Read", "input": {"file_path": f"{repo}/calc.py"}},
        {"tool": "Bash", "input": {"command": "git diff", "description": "Show the change"}},
        {"text": "Fixed: add() subtracted; it now adds and the test prints ok."},
        # task 2 (claude --continue): the log read in two halves by Read (Bash would keep only a 2 KB
        # preview of it), which carries the context past the compaction threshold session.py sets
        {"tool": "Read", "input": {"file_path": f"{repo}/build.log", "offset": 1, "limit": 750}},
        {"tool": "Read", "input": {"file_path": f"{repo}/build.log", "offset": 751, "limit": 750}},
        {"tool": "Bash", "input": {"command": "tail -3 build.log", "description": "Read its end"}},
        {"text": "The build ran all 1500 steps; the log ends without an error."},
    ]  # fmt: skip


def codex_steps(repo: str) -> list[dict[str, Any]]:
    """Codex CLI's tools: exec_command runs a shell command (its edits are shell edits too)."""

    def sh(cmd: str, text: str = "") -> dict[str, Any]:
        return {"text": text, "tool": "exec_command", "input": {"cmd": cmd, "workdir": repo}}

    return [
        sh("ls", "Let me look at the repository."), sh("cat README.md"), sh("cat calc.py"), sh("cat test_calc.py"),
        sh("python3 test_calc.py"), sh("grep -n 'def add' calc.py"),
        sh("sed -i 's/return a - b/return a + b/' calc.py", "add subtracts."), sh("python3 test_calc.py"),
        sh("cat calc.py"), sh("git diff"),
        {"text": "Fixed: add() subtracted; it now adds and the test prints ok."},
        # task 2 (codex exec resume --last)
        sh("cat build.log"), sh("tail -3 build.log"),
        {"text": "The build ran all 1500 steps; the log ends without an error."},
    ]  # fmt: skip


# Claude Code's compaction request carries the main loop's tools (a fork sharing its cached prefix) and
# ends on this instruction: the scripted server answers it with ``CLAUDE_SUMMARY``, taking no step.
CLAUDE_COMPACT_MARK = "Do NOT call any tools"
CLAUDE_SUMMARY = (
    "<analysis>The user asked to fix a failing test, then about build.log.</analysis>\n<summary>\n"
    "1. Primary Request: fix the failing test in test_calc.py; then say whether build.log shows a finished build.\n"
    "2. Work so far: add() in calc.py subtracted; it was changed to add and python3 test_calc.py prints ok. "
    "build.log (1500 lines) was read in two halves.\n"
    "3. Current Work: reading the end of build.log.\n</summary>"
)


def script(agent: str, repo: str) -> dict[str, Any]:
    """The server's ``--script`` of an agent's session."""
    if agent == "claude-code":
        return {"steps": claude_steps(repo), "side": CLAUDE_SUMMARY, "side_when": [CLAUDE_COMPACT_MARK]}
    return {"steps": codex_steps(repo), "side": "OK"}
