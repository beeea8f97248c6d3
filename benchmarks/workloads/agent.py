"""An agent-scale, Claude Code-shaped coding session, generated from data under a fixed seed.

Shape (what the issue asks a skeptical reader to see): a long system prompt (identity, working rules,
tool guidance, environment) plus 25-40 tool schemas with long descriptions, i.e. 15-25K tokens of static
prefix; 40-60 main-thread turns of explore / read / edit / test with tool results of up to several thousand
tokens (whole-file reads, full test logs); several user turns; two sub-agents that share the parent's
system prompt and tools.  Compaction is a pattern (``history.compact_threshold``), not part of the data.

Built on load (it is a pure function of the seed), so nothing large is committed.
"""

from __future__ import annotations

import random
from typing import Any

from kvreuse.benchmarks.workloads import codegen
from kvreuse.benchmarks.workloads.agents import _Script, _think
from kvreuse.benchmarks.workloads.prompts import _COMMON_RULES, CODING_SYSTEM, CODING_TOOLS, _fn, _i, _s
from kvreuse.benchmarks.workloads.trajectory import Trajectory

# name, one-line purpose, parameters (name, type, description): the "data" the schemas are built from
_TOOL_DATA: list[tuple[str, str, list[tuple[str, str, str]]]] = [
    ("bash", "Run a shell command in the repository's sandbox and return stdout, stderr and the exit code",
     [("command", "s", "The command line to run."), ("timeout_s", "i", "Seconds before the command is killed.")]),
    ("edit_file", "Replace one exact occurrence of a string in a file",
     [("path", "s", "File to edit."), ("old_string", "s", "Exact text to replace."), ("new_string", "s", "Replacement text.")]),
    ("multi_edit", "Apply several exact-string replacements to one file atomically",
     [("path", "s", "File to edit."), ("edits", "s", "JSON list of {old_string, new_string} pairs.")]),
    ("glob", "List files matching a glob pattern, newest first",
     [("pattern", "s", "Glob such as src/**/*.ts."), ("path", "s", "Directory to search.")]),
    ("ls", "List a directory's entries with sizes and modification times",
     [("path", "s", "Directory to list."), ("ignore", "s", "Comma-separated globs to skip.")]),
    ("notebook_edit", "Replace, insert or delete one cell of a Jupyter notebook",
     [("notebook_path", "s", "Notebook file."), ("cell_id", "s", "Cell to change."), ("new_source", "s", "New cell source.")]),
    ("web_fetch", "Fetch a URL and return its main text as Markdown",
     [("url", "s", "Absolute http(s) URL."), ("prompt", "s", "What to extract from the page.")]),
    ("web_search", "Search the web and return titles, URLs and snippets",
     [("query", "s", "Search query."), ("max_results", "i", "At most this many results.")]),
    ("todo_write", "Create or update the session's task list",
     [("todos", "s", "JSON list of {id, content, status} items.")]),
    ("task", "Start a sub-agent with its own context for a self-contained task and return its final report",
     [("description", "s", "Three to five words."), ("prompt", "s", "Full instructions for the sub-agent.")]),
    ("git_status", "Show the working tree status", [("path", "s", "Limit to this path.")]),
    ("git_diff", "Show unstaged or staged changes", [("staged", "s", "'true' for the index."), ("path", "s", "Limit to this path.")]),
    ("git_log", "Show recent commits", [("max_count", "i", "Number of commits."), ("path", "s", "Limit to this path.")]),
    ("git_commit", "Commit staged changes with a message", [("message", "s", "Commit message.")]),
    ("run_tests", "Run the test suite or a subset with pytest and return the full log",
     [("selector", "s", "pytest node id or -k expression."), ("maxfail", "i", "Stop after this many failures.")]),
    ("lint", "Run ruff on files and return its findings", [("paths", "s", "Space-separated paths."), ("fix", "s", "'true' to apply fixes.")]),
    ("type_check", "Run mypy on a package", [("package", "s", "Dotted package name.")]),
    ("coverage_report", "Coverage of the last test run per file", [("include", "s", "Glob of files to report.")]),
    ("db_query", "Run a read-only SQL query against the development database",
     [("sql", "s", "One SELECT statement."), ("limit", "i", "Row limit.")]),
    ("db_schema", "Describe tables and columns of the development database", [("table", "s", "Table name or empty for all.")]),
    ("http_request", "Send an HTTP request to the locally running service",
     [("method", "s", "GET, POST, PUT, PATCH or DELETE."), ("path", "s", "Path such as /v1/payments."), ("body", "s", "JSON body.")]),
    ("service_logs", "Tail the local service's logs", [("lines", "i", "Number of lines."), ("grep", "s", "Only lines matching.")]),
    ("docs_search", "Search the project's internal documentation", [("query", "s", "Search terms.")]),
    ("issue_view", "Show an issue from the tracker with its comments", [("number", "i", "Issue number.")]),
    ("pr_view", "Show a pull request's description, checks and review comments", [("number", "i", "PR number.")]),
    ("pr_create", "Open a pull request from the current branch", [("title", "s", "PR title."), ("body", "s", "PR description.")]),
    ("skill", "Load the full instructions of an installed skill by name", [("name", "s", "Skill name from the catalogue.")]),
    ("ask_user", "Ask the user a question and wait for the answer", [("question", "s", "One clear question.")]),
    ("memory_read", "Read the project's long-term memory notes", [("topic", "s", "Topic key.")]),
    ("memory_write", "Save a note to the project's long-term memory", [("topic", "s", "Topic key."), ("note", "s", "Note text.")]),
]  # fmt: skip

_GUIDANCE = [
    "Use it only when a dedicated tool does not cover the job; dedicated tools return structured output the session can rely on.",
    "Paths are relative to the repository root unless they start with a slash; never reach outside the workspace.",
    "Results longer than 30,000 characters are truncated, and the truncation is marked; ask for a narrower range instead of repeating the call.",
    "Independent calls can be issued in parallel; calls that depend on an earlier result must wait for it.",
    "The call fails with a clear message when an argument is missing or malformed; read the message before retrying with corrected arguments.",
    "Do not use this tool to work around a permission the user denied; ask instead.",
    "Every call is logged with its arguments, so never put secrets into arguments.",
    "Prefer the smallest call that answers the question: a line range, a single table, one test node.",
    "When the output contradicts what you expected, say so explicitly and revise the plan before acting on it.",
    "Quote identifiers from the output exactly; a commit hash or path that is one character off breaks the next call.",
]

_SECTIONS = [
    "Task management", "Reading code", "Editing code", "Running commands", "Testing", "Version control",
    "Pull requests", "Talking to the user", "Security", "Sub-agents", "Memory", "Skills", "Databases",
    "HTTP services", "Documentation", "Dependencies", "Performance", "Refactoring",
]  # fmt: skip
_SKILLS = [
    ("pdf", "Read, fill and merge PDF files"), ("xlsx", "Read and write spreadsheets with formulas"),
    ("migrations", "Write and check Alembic database migrations"), ("release-notes", "Draft release notes from git history"),
    ("incident", "Triage a production incident from logs and metrics"), ("api-design", "Review an HTTP API change"),
    ("perf", "Profile a slow endpoint and propose fixes"), ("i18n", "Add or check translations"),
    ("security-review", "Review a diff for injection, auth and secrets issues"), ("docs", "Write user-facing documentation"),
]  # fmt: skip


def _system(rng: random.Random) -> str:
    parts = [CODING_SYSTEM, _COMMON_RULES]
    for title in _SECTIONS:
        rules = rng.sample(_GUIDANCE, k=10)
        body = "\n".join(f"- {title}: {r}" for r in rules)
        parts.append(f"# {title}\n{body}\n")
    catalogue = "\n".join(
        f"- {name}: {what}. Use when the task is about {what.lower()}; do not use it for anything else."
        for name, what in _SKILLS
    )
    parts.append(f"# Skills catalogue (load one with the `skill` tool)\n{catalogue}\n")
    parts.append(
        "# Environment\nWorking directory: /workspace/ledgerly\nPlatform: linux\nShell: bash\n"
        "Is a git repository: yes\nModel: kvreuse-agent\n"
    )
    return "\n".join(parts)


def _tools(rng: random.Random) -> list[dict[str, Any]]:
    tools = list(CODING_TOOLS)
    for name, purpose, params in _TOOL_DATA:
        notes = " ".join(rng.sample(_GUIDANCE, k=rng.randint(8, 10)))
        props = {
            p: (_s if t == "s" else _i)(f"{d} {rng.choice(_GUIDANCE)}") for p, t, d in params
        }  # fmt: skip
        tools.append(_fn(name, f"{purpose}. {notes}", props, [params[0][0]]))
    return tools


_USER_TASKS = [
    "Statements for accounts in JPY show amounts 100x too large. Find out why and fix it with a test.",
    "While you are there: the reconciliation job logs every matched entry at INFO; make that DEBUG.",
    "Also, the /v1/refunds endpoint returns 500 for an unknown payment id; it should be 404 with an error body.",
    "Last thing: run the whole suite and the linter, then summarise every change you made.",
]


def _work_round(s: _Script, rng: random.Random, thread: int, big: bool) -> None:
    """grep -> read a whole file -> edit -> run tests (and sometimes read the log of a failure)."""
    regex = f"def {rng.choice(codegen.VERBS)}_{rng.choice(codegen.NOUNS)}"
    (cid,) = s.reply(
        thread, "", [("grep", {"regex": regex, "glob": "*.py"})], _think(rng, "Find where it is.")
    )
    s.tool(thread, cid, "grep", codegen.grep_output(rng, regex, rng.randint(6, 14)))
    path = codegen.module_path(rng)
    (cid,) = s.reply(thread, f"Reading `{path}`.", [("read_file", {"path": path})])
    s.tool(thread, cid, "read_file", codegen.code_file(rng, path, rng.randint(6, 14) if big else 3))
    content = codegen.patch_content(rng, path)
    why = _think(rng, f"The conversion in {path} happens before rounding.", "Patch it.")
    (cid,) = s.reply(thread, "", [("write_file", {"path": path, "content": content})], why)
    s.tool(thread, cid, "write_file", codegen.write_result(rng, path, content))
    cmd = f"pytest -q tests/{path.split('/')[1]}"
    (cid,) = s.reply(thread, "Running the package's tests.", [("run_tests", {"selector": cmd[10:]})])
    s.tool(thread, cid, "run_tests", codegen.test_run_output(rng, cmd, failing=rng.randint(0, 2), packages=6))


def agent(seed: int, quick: bool = False) -> Trajectory:
    """The session: 4 user tasks, ~12 work rounds, two sub-agent audits (see module docstring)."""
    rng = random.Random(seed)
    s = _Script(rng)
    system, tools = _system(rng), _tools(rng)
    rounds = (1, 1) if quick else (4, 3, 2, 3)
    for t, (task, n) in enumerate(zip(_USER_TASKS, rounds, strict=False)):
        s.user(0, task)
        if t == 0:
            plan = '[{"id": 1, "content": "locate conversion", "status": "in_progress"}]'
            (cid,) = s.reply(0, "", [("todo_write", {"todos": plan})], _think(rng, "Plan first."))
            s.tool(0, cid, "todo_write", "Todos updated (1 item).")
        if t == 1 and not quick:
            calls = [("task", {"description": f"Audit logging in {a}", "prompt": f"List every log.info call in "
                               f"ledgerly/{a}/ with path:line and its message."}) for a in ("reconcile", "payments")]  # fmt: skip
            for i, call in enumerate(calls, start=1):
                (cid,) = s.reply(0, "Delegating the audit.", [call])
                s.user(i, call[1]["prompt"])
                for _ in range(2):
                    _work_round_sub(s, rng, i)
                report = f"{call[1]['description']}: " + "; ".join(
                    f"{codegen.module_path(rng)}:{rng.randint(10, 400)} logs at INFO" for _ in range(4)
                )
                s.reply(i, report)
                s.tool(0, cid, "task", report)
        for r in range(n):
            _work_round(s, rng, 0, big=r % 2 == 0)
        s.reply(0, f"Done with this part: {task.split('.')[0].lower()} is fixed and tested.")
    return Trajectory("agent", "quick" if quick else "default", seed, system, tools, s.turns)


def _work_round_sub(s: _Script, rng: random.Random, thread: int) -> None:
    regex = r"log\.info\("
    (cid,) = s.reply(thread, "", [("grep", {"regex": regex, "glob": "*.py"})])
    s.tool(thread, cid, "grep", codegen.grep_output(rng, regex, rng.randint(8, 16)))
    path = codegen.module_path(rng)
    (cid,) = s.reply(thread, "", [("read_file", {"path": path})], _think(rng, "Check the calls."))
    s.tool(thread, cid, "read_file", codegen.code_file(rng, path, rng.randint(4, 8)))
