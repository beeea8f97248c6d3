"""The report's "Real agents" section, from the kept recordings (``benchmarks/results/agents``): each
agent's reuse and its breaks, the naive baseline, the free-mode run, and seed 001's claims about Claude
Code's context layout with a verdict computed on the real traffic where one is checkable."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from kvreuse.benchmarks.agents.analyze import chat_records

BILLING = "x-anthropic-billing-header:"  # Claude Code's per-request nonce block (not rendered by default)
RESULTS = Path(__file__).resolve().parents[1] / "results" / "agents"


def _content(x: Any) -> Any:
    """``x`` without ``cache_control`` marks: Claude Code moves its mark to the newest block on every
    request, a cache hint rather than a change of content (the server pins by it, it renders nothing)."""
    if isinstance(x, dict):
        return {k: _content(v) for k, v in x.items() if k != "cache_control"}
    if isinstance(x, list):
        return [_content(v) for v in x]
    return x


def _history(rec: dict) -> list:
    r = rec["request"]
    return _content(r.get("messages") if rec["path"] == "/v1/messages" else r.get("input"))


def _main(session: dict) -> list[dict]:
    return [
        r
        for r in chat_records(session["records"])
        if (r["result"].get("kvreuse") or {}).get("scripted") != "side"
    ]


def claims(session: dict) -> list[tuple[str, str, str]]:
    """(claim, measured, verdict) of seed 001 on one agent's traffic."""
    main = _main(session)
    out = []
    pairs = list(zip(main, main[1:]))
    appended = sum(_history(b)[: len(_history(a))] == _history(a) for a, b in pairs)
    out.append(("each loop round only appends to the history, never edits it (001: 上下文只可增，不可改)",
                f"{appended} of {len(pairs)} consecutive main requests extend the previous one's history item for item "
                "(`cache_control` marks aside: Claude Code moves its mark to the newest block each request)",
                "confirmed" if appended == len(pairs) else "partly" if appended else "refuted"))  # fmt: skip
    tools = Counter(json.dumps(r["request"].get("tools"), sort_keys=True) for r in main)
    out.append(("the tools field is the same on every request of a session (001: tools 字段全程不变)",
                f"{len(tools)} distinct tool list(s) over {len(main)} main requests",
                "confirmed" if len(tools) == 1 else "refuted"))  # fmt: skip
    if session["agent"] == "claude-code":
        systems = Counter(json.dumps(r["request"].get("system"), sort_keys=True) for r in main)
        bare = Counter(json.dumps([b for b in r["request"].get("system") or [] if not str(b.get("text", "")).startswith(BILLING)],
                                  sort_keys=True) for r in main)  # fmt: skip
        out.append(("the system prompt is static within a session (001: system 相对固定)",
                    f"{len(systems)} distinct system value(s) over {len(main)} main requests (the billing header's "
                    f"cc_version suffix included: it changes after a compaction), {len(bare)} without that block "
                    "(which the server leaves out of the prompt)",
                    "confirmed" if len(systems) == 1 else "partly" if len(bare) == 1 else "refuted"))  # fmt: skip
        first = _history(main[0])[0]["content"]
        blocks = (
            [b.get("text", "") for b in first if isinstance(b, dict)] if isinstance(first, list) else [first]
        )
        reminders = [b for b in blocks if b.startswith("<system-reminder>")]
        has = any("currentDate" in b or "Today's date" in b for b in reminders)
        out.append(("the first user message carries a <system-reminder> with AGENTS.md/memory and the date (001: # currentDate)",
                    f"{len(reminders)} <system-reminder> blocks (environment, model, deferred tools, agent types); "
                    f"date {'present' if has else 'absent'} (the scratch repository has no CLAUDE.md)",
                    "confirmed" if has and reminders else "partly" if reminders else "refuted"))  # fmt: skip
        sys_chars = sum(len(b.get("text", "")) for b in main[0]["request"].get("system") or [])
        tool_chars = len(json.dumps(main[0]["request"].get("tools")))
        within = sum(2_000 <= n <= 20_000 for n in (sys_chars, tool_chars))  # 几 KB 到十几 KB: ~2-20 KB
        out.append(("system and tools each a few KB to ten-odd KB (001: 几 KB 到十几 KB)",
                    f"system {sys_chars:,} characters, tools {tool_chars:,} characters (JSON); ten-odd KB read as <= 20,000",
                    ("refuted", "partly", "confirmed")[within]))  # fmt: skip
    return out


TEMPLATE_CAUSES = ("template_rerendered", "assistant_turn_differs")


def _side_lines(s: dict[str, Any]) -> list[str]:
    """Each side request (the agent's compaction, a summary, a title) and what the main request after it
    found in the cache: a compaction replaces the history, the cost is that request's deficit."""
    out, rows = [], s["rows"]
    for side in s["side_requests"]:
        r = next(x for x in rows if x["seq"] == side["seq"])
        nxt = next((x for x in rows if x["seq"] > side["seq"] and x["kind"] == "main"), None)
        line = (f"- side request {side['seq']} ({side['prompt_tokens']:,} prompt tokens, {r['cached_tokens']:,} cached: "
                f"the agent's compaction or a summary, its reply scripted)")  # fmt: skip
        if nxt is not None:
            line += (f"; the main request after it ({nxt['seq']}) found {nxt['cached_tokens']:,} of {nxt['prompt_tokens']:,} "
                     f"tokens cached, {nxt['deficit']:,} short of the previous sequence (break `{nxt['cause']}` at {nxt['where']})")  # fmt: skip
        out.append(line + ".")
    return out


def _template_line(s: dict[str, Any]) -> list[str]:
    """The breaks Qwen3's template makes (not the agent): it renders an empty ``<think></think>`` into the
    turn being generated and drops it from the same turn once it is history."""
    rs = [r for r in s["rows"] if r["deficit"] > 16 and r["cause"] in TEMPLATE_CAUSES]
    if not rs:
        return []
    return [f"- of these, {len(rs)} (deficit {sum(r['deficit'] for r in rs):,} tokens in all, "
            f"{max(r['deficit'] for r in rs)} at most) are Qwen3's template, not the agent: the reply is generated "
            "after an empty `<think>\\n\\n</think>` block the template leaves out of the same turn once it is history, "
            "so the previous reply's last pages are recomputed on every request; kept, as it is what a Qwen3 user "
            "sees (a template that renders history as generated would not have it)."]  # fmt: skip


def _pct(x: float) -> str:
    return f"{x:.1%}"


def section(results: Path = RESULTS) -> list[str]:
    path = results / "summary.json"
    if not path.exists():
        return []
    summaries: dict[str, Any] = json.loads(path.read_text())
    lines = ["", "## Real agents (scripted)", "",
             "The real agent programs (`make agents`: Claude Code 2.1.328, Codex CLI 0.169.0 from npm) run as "
             "subprocesses against `kvreuse serve` on a scratch repository (`kvreuse bench agents`, "
             "`benchmarks/agents/`): task 1 lists, reads, runs a failing test, edits the bug, runs it again and "
             "answers; task 2 continues the session with a long log. **Scripted**: the words of each reply come from "
             "a script (`--script`), every token goes through the engine, the prefix cache and the chat template "
             "(forced decoding), on a tiny random model with Qwen3's vocabulary and template (token counts are "
             "exact; outputs would be noise). `ideal` = the previous main request's whole sequence (prompt + reply) "
             "in whole pages where the new prompt extends it; every deficit over one page carries the server's "
             "named break. The cache-off column replays the same requests through the pattern benchmark's target "
             "with the prefix cache off (the naive baseline).", "",
             "| agent | model requests (main / side) | prompt tokens | cached (share) | ideal (share) | deficits > 1 page: named / all | prefilled, cache on / off (savings) | replay = live |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, s in summaries.items():
        rp = s.get("replay") or {}
        on, off = (rp.get("cache_on") or {}), (rp.get("cache_off") or {})
        base = (f"{on['prefilled_tokens']:,} / {off['prefilled_tokens']:,} ({_pct(rp['savings_vs_naive'])})"
                if on else "-")  # fmt: skip
        live = f"{on.get('matches_live', 0)} of {len(on.get('rows', []))}" if on else "-"
        named = s["breaks_over_a_page"] - s["unexplained_breaks"]
        lines.append(f"| {name} | {s['model_requests']} ({s['main_requests']} / {len(s['side_requests'])}) | "
                     f"{s['prompt_tokens']:,} | {s['cached_tokens']:,} ({_pct(s['cached_share'])}) | "
                     f"{s['ideal_cached']:,} ({_pct(s['ideal_share'])}) | {named} / {s['breaks_over_a_page']} | {base} | {live} |")  # fmt: skip
    for name, s in summaries.items():
        lines += ["", f"**{name}**: breaks over one page, by the server's diagnosis:", ""]
        seen: dict[str, dict] = {}
        for r in s["rows"]:
            if r["deficit"] > 16:
                seen.setdefault(r["cause"], r)
        for cause, r in seen.items():
            n = sum(1 for x in s["rows"] if x["deficit"] > 16 and x["cause"] == cause)
            lines.append(f"- `{cause}` x{n} (e.g. request {r['seq']}, deficit {r['deficit']} tokens, at {r['where']}): "
                         f"{r['detail']}; the earlier sequence read `{(r['before_text'] or '')[-40:]!r}`, this one "
                         f"`{(r['new_text'] or '')[:40]!r}`.")  # fmt: skip
        lines += _side_lines(s) + _template_line(s)
    free = results / "free.json"
    if free.exists():
        lines += [
            "",
            "Free mode (the model's own replies, Gemma 3 270M, task 1 once; not comparable to the scripted figures):",
            "",
        ]
        for name, f in json.loads(free.read_text()).items():
            lines.append(f"- {name}: {f['model_requests']} model request(s), HTTP statuses {sorted(set(f['http_statuses']))}, "
                         f"{f['server_errors']} server error(s), agent exit code {f['rc']}"
                         + "".join(f"; refused: {m}" for m in f.get("refusals") or [])
                         + (f"; replies capped at {f['max_tokens_cap']} tokens ({f.get('capped_replies', 0)} reached it), "
                            f"{f.get('wall_s', '?')} s" if f.get("max_tokens_cap") else "")
                         + (f"; {f['note']}" if f.get("note") else "")
                         + (f"; the agent printed: `{' '.join(f['answer'].split())[:200]}`" if f.get("answer") else "") + ".")  # fmt: skip
    lines += ["", "Seed 001's claims about Claude Code's context layout, checked on the recorded traffic "
              "(computed in `benchmarks/agents/report.py`):", "",
              "| agent | claim | measured | verdict |", "|---|---|---|---|"]  # fmt: skip
    for name in summaries:
        sp = results / f"{name}.json"
        if sp.exists():
            for claim, measured, verdict in claims(json.loads(sp.read_text())):
                lines.append(f"| {name} | {claim} | {measured} | {verdict} |")
    return lines + [""]
