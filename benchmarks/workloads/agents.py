"""Seeded builders for the three agent sessions: coding, research, and a sub-agent fan-out."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from kvreuse.benchmarks.workloads import codegen, webgen
from kvreuse.benchmarks.workloads.prompts import (
    CODING_SYSTEM,
    CODING_TOOLS,
    RESEARCH_SYSTEM,
    RESEARCH_TOOLS,
    compact_system,
    compact_tools,
)
from kvreuse.benchmarks.workloads.trajectory import Message, Trajectory, Turn


@dataclass
class _Script:
    """Accumulates turns; tool results and user messages wait in ``pending`` until the next reply."""

    rng: random.Random
    turns: list[Turn] = field(default_factory=list)
    pending: dict[int, list[Message]] = field(default_factory=dict)
    n_calls: int = 0

    def user(self, thread: int, text: str) -> None:
        self.pending.setdefault(thread, []).append({"role": "user", "content": text})

    def tool(self, thread: int, call_id: str, name: str, content: str) -> None:
        msg = {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}
        self.pending.setdefault(thread, []).append(msg)

    def reply(
        self,
        thread: int,
        content: str,
        calls: list[tuple[str, dict[str, Any]]] = (),
        reasoning: str | None = None,
    ) -> list[str]:
        ids = []
        msg: Message = {"role": "assistant", "content": content}
        if reasoning:
            msg["reasoning_content"] = reasoning
        if calls:
            tool_calls = []
            for name, args in calls:
                self.n_calls += 1
                ids.append(f"call_{self.n_calls:03d}_{self.rng.randint(0, 16**6):06x}")
                fn = {"name": name, "arguments": json.dumps(args)}
                tool_calls.append({"id": ids[-1], "type": "function", "function": fn})
            msg["tool_calls"] = tool_calls
        self.turns.append(Turn(thread, self.pending.pop(thread, []), msg))
        return ids


def _think(rng: random.Random, *ideas: str) -> str:
    lead = rng.choice(["Okay,", "Right,", "Let me think.", "Hmm,"])
    return f"{lead} {' '.join(ideas)}"


def _fix(s: _Script, thread: int, path: str, fix_rounds: int) -> None:
    """write -> run, ``fix_rounds`` times, on a file the thread has read."""
    r = s.rng
    for _ in range(fix_rounds):
        content = codegen.from_first_def(codegen.patch_content(r, path))
        why = _think(r, f"The check in {path} compares before converting currency.", "Rewrite the function.")
        (cid,) = s.reply(thread, "", [("write_file", {"path": path, "content": content})], why)
        s.tool(thread, cid, "write_file", codegen.write_result(r, path, content))
        cmd = f"pytest -q tests/{path.split('/')[1]}"
        (cid,) = s.reply(thread, "Running the tests for this package.", [("run", {"command": cmd})])
        s.tool(thread, cid, "run", codegen.test_run_output(r, cmd, failing=r.randint(0, 1), packages=2))


def _read(s: _Script, thread: int, path: str, file_fns: int) -> None:
    """Read the file from its first function on (offset/limit), as agents do after a grep hit."""
    text = codegen.from_first_def(codegen.code_file(s.rng, path, file_fns))
    offset = int(text.split("\t", 1)[0])
    args = {"path": path, "offset": offset, "limit": 40}
    (cid,) = s.reply(thread, f"The logic lives in `{path}`; reading it.", [("read_file", args)])
    s.tool(thread, cid, "read_file", text)


def _explore_and_fix(s: _Script, thread: int, file_fns: int, fix_rounds: int, find: bool = True) -> str:
    """(find ->) grep -> read -> (write -> run) x fix_rounds; returns the path fixed."""
    r = s.rng
    pattern = "ledgerly/**/*.py"
    if find:
        (cid,) = s.reply(
            thread, "", [("find", {"pattern": pattern})], _think(r, "I should see the layout first.")
        )
        s.tool(thread, cid, "find", codegen.find_output(r, pattern, 4))
    regex = f"def {r.choice(codegen.VERBS)}_{r.choice(codegen.NOUNS)}"
    (cid,) = s.reply(
        thread, "", [("grep", {"regex": regex, "glob": "*.py"})], _think(r, "Find the entry point.")
    )
    s.tool(thread, cid, "grep", codegen.grep_output(r, regex, 4))
    path = codegen.module_path(r)
    _read(s, thread, path, file_fns)
    _fix(s, thread, path, fix_rounds)
    return path


def coding(seed: int, quick: bool) -> Trajectory:
    """A bug fix plus (default variant) a follow-up request, with file tools, in one thread.

    Ten turns with short tool results by default: the patterns that recompute the whole prompt every
    turn cost (turns x context) tokens, so this workload is the smallest the benchmark's claims allow.
    The quick variant skips the `find` step (five turns) behind a compact prefix (first-sentence tool descriptions,
    no working rules) so that a smoke run fits in two minutes on two CPU cores.
    """
    rng = random.Random(seed)
    s = _Script(rng)
    s.user(
        0,
        "Refunds that arrive after a statement closes are counted twice by the nightly reconciliation "
        "job. Find the cause, fix it, and add a regression test.",
    )
    path = _explore_and_fix(s, 0, file_fns=1, fix_rounds=1, find=not quick)
    s.reply(
        0,
        f"Fixed: `{path}` now matches refunds by reference before amount, so a late refund is "
        "applied once. Regression test added; the package's tests pass.",
    )
    if quick:
        return Trajectory(
            "coding", "quick", seed, compact_system(CODING_SYSTEM), compact_tools(CODING_TOOLS), s.turns
        )
    s.user(0, "Thanks. Do chargebacks have the same problem? If so fix them the same way.")
    path = codegen.module_path(rng)
    _read(s, 0, path, 1)
    _fix(s, 0, path, 1)
    s.reply(0, f"Yes, chargebacks had the same ordering bug; fixed in `{path}` with a matching test.")
    return Trajectory("coding", "default", seed, CODING_SYSTEM, CODING_TOOLS, s.turns)


def research(seed: int, quick: bool) -> Trajectory:
    """A sourced research question with long fetched pages, then a follow-up."""
    rng = random.Random(seed)
    s = _Script(rng)
    s.user(
        0,
        "How much does automatic prefix caching reduce time to first token for multi-turn agent "
        "workloads in vLLM and SGLang? I need figures with sources.",
    )
    rounds = [(1, 4)] if quick else [(2, 4), (1, 4)]
    for n_fetch, paras in rounds:
        query = f"{rng.choice(webgen.SYSTEMS)} {rng.choice(webgen.FEATURES)} time to first token benchmark"
        (cid,) = s.reply(0, "", [("web_search", {"query": query})], _think(rng, "Start with a broad search."))
        text, urls = webgen.search_results(rng, query, 4)
        s.tool(0, cid, "web_search", text)
        for url in urls[:n_fetch]:
            (cid,) = s.reply(0, "", [("fetch_url", {"url": url})], _think(rng, "This one looks primary."))
            s.tool(0, cid, "fetch_url", webgen.article(rng, url, paras))
            fact = webgen.finding(rng)
            (cid,) = s.reply(
                0, "", [("save_note", {"fact": fact, "source_url": url, "confidence": "medium"})]
            )
            s.tool(0, cid, "save_note", f"Saved {webgen.note_id(rng)}.")
    s.reply(0, "Summary: " + " ".join(webgen.finding(rng) for _ in range(3)))
    s.user(0, "Does any of this hold for hosted APIs with prompt caching?")
    query = "hosted API prompt caching minimum prefix discount"
    (cid,) = s.reply(0, "", [("web_search", {"query": query})], _think(rng, "Check the provider docs."))
    text, urls = webgen.search_results(rng, query, 3)
    s.tool(0, cid, "web_search", text)
    (cid,) = s.reply(0, "", [("fetch_url", {"url": urls[0]})])
    s.tool(0, cid, "fetch_url", webgen.article(rng, urls[0], 3))
    s.reply(0, "Mostly yes: " + webgen.finding(rng))
    return Trajectory(
        "research", "quick" if quick else "default", seed, RESEARCH_SYSTEM, RESEARCH_TOOLS, s.turns
    )


def fanout(seed: int, quick: bool) -> Trajectory:
    """A parent delegating three explorations to sub-agents that share its system prompt and tools."""
    rng = random.Random(seed)
    s = _Script(rng)
    areas = ["payments", "reconcile", "fx"]
    s.user(
        0,
        "Audit every place where amounts are converted between currencies and make them all use "
        "ledgerly.fx.convert(). Use sub-agents for the exploration.",
    )
    calls = [
        (
            "task",
            {
                "description": f"Audit conversions in {a}",
                "prompt": f"List every currency conversion in "
                f"ledgerly/{a}/ with path:line and whether it uses ledgerly.fx.convert().",
            },
        )
        for a in areas
    ]
    ids = s.reply(
        0, "Delegating one audit per package.", calls, _think(rng, "Three packages, three sub-agents.")
    )
    for i, (area, cid) in enumerate(zip(areas, ids, strict=True), start=1):
        s.user(i, calls[i - 1][1]["prompt"])
        regex = r"\* rate|convert\(|fx_rate"
        (gid,) = s.reply(i, "", [("grep", {"regex": regex, "path": f"ledgerly/{area}"})])
        s.tool(i, gid, "grep", codegen.grep_output(rng, regex, 6 if quick else 9))
        for _ in range(0 if quick else 2):
            path = codegen.module_path(rng)
            (rid,) = s.reply(i, "", [("read_file", {"path": path})], _think(rng, "Check this file."))
            s.tool(i, rid, "read_file", codegen.code_file(rng, path, 2))
        conclusion = f"{area}: " + "; ".join(
            f"{codegen.module_path(rng)}:{rng.randint(10, 400)} multiplies by a raw rate" for _ in range(3)
        )
        s.reply(i, conclusion)
        s.tool(0, cid, "task", conclusion)
    path = codegen.module_path(rng)
    content = codegen.patch_content(rng, path)
    (cid,) = s.reply(
        0, "", [("write_file", {"path": path, "content": content})], _think(rng, "Start with fx.")
    )
    s.tool(0, cid, "write_file", codegen.write_result(rng, path, content))
    (cid,) = s.reply(0, "", [("run", {"command": "pytest -q"})])
    s.tool(0, cid, "run", codegen.test_run_output(rng, "pytest -q", failing=0))
    s.reply(0, "All conversions now go through ledgerly.fx.convert(); the full test suite passes.")
    return Trajectory("fanout", "quick" if quick else "default", seed, CODING_SYSTEM, CODING_TOOLS, s.turns)


BUILDERS = {"coding": coding, "research": research, "fanout": fanout}
