"""Seed claims the third edition had no row for (issue #57's audit): rows where the runs can judge them,
and for the rest a stated reason with what would measure them (``WITHOUT_ROW``, listed under the table)."""

from __future__ import annotations

from kvreuse.benchmarks.patterns.verdicts import MAIN, Measured, Runs


def _messages_bulk(R: Runs) -> tuple[str, float, float] | None:
    w = "agent" if R.get("agent", "append_only") is not None else "coding"
    run = R.get(w, "append_only")
    if run is None:
        return None
    main = [x for x in run["requests"] if x["thread"] == 0]
    static, top = main[0]["prompt_tokens"], max(x["prompt_tokens"] for x in main)
    share = 1 - static / top
    return (f"{w}: system + tools + first message {static:,} tokens; the largest main-thread prompt {top:,}, of which "
            f"{share:.0%} is the messages after them", share, 0.5)  # fmt: skip


COVERAGE_CLAIMS = [
    Measured("System prompt and tools are a few KB each; the messages are the bulk of a long session's context",
             "001 §上下文全景", "agent (else coding): append_only, main thread", _messages_bulk,
             "value: share of the largest main-thread prompt after the system prompt, tools and first message; "
             "bound 50%", "tool results and replies accumulate; the static prefix does not grow",
             sides=(("agent", "append_only", MAIN),)),
]  # fmt: skip

# Seed claims with no row: (claim, seed section, why, what would measure it)
WITHOUT_ROW = [
    ("A sub-agent adds only two messages to the main context (the task and its conclusion)",
     "003 §隔离优于压缩：子 Agent 上下文隔离", "true by construction of the fanout workload (each sub-agent is one "
     "call and one result in the main thread: its 3 sub-agents add 4 messages, 6 items), so a row could not fail; "
     "{row:Isolation beats compression} measures what it buys", "recorded agents' traffic (the real-agents section, when recordings exist)"),
    ("A skill activated later stays where it happened", "000 §换轮时哪些内容会延续",
     "the same pair as {row:A skill loaded into the system prompt} and {row:Old history is merged verbatim} (the skill as a message where it was loaded, vs moved into the system "
     "prompt or re-read): those rows cite it", "-"),
    ("Switching model or provider loses the cache", "000 §能力开关与缓存",
     "true by construction: one model's KV cannot serve another, so a switch prefills the whole context once "
     "(what the first request of a cold session costs, in every run's first row)",
     "a run with a mid-session model switch: the switch request's prefill equals its prompt"),
    ("The compaction boundary never splits a tool call from its result", "000 §压缩怎样工作",
     "`compression.py` cuts at turn boundaries, and no pattern here splits a pair, so a row could only ever be "
     "confirmed (the integrity audit rejects a rule that cannot fail)",
     "a pattern that cuts mid-turn, beside compact_threshold, checked for orphaned calls and results"),
    ("A failed or not-shorter summary never replaces the old one", "000 §压缩怎样工作",
     "our deterministic summariser is always shorter, so the guard never fires on these workloads",
     "a summariser with a measured failure rate (a real model), counting replacements by failed summaries"),
    ("Code and JSON cost more tokens per character than prose", "000 §Token 是什么",
     "not built: needs a per-content-type tokenisation pass ({row:Token counts differ slightly} and the stacks' tables give totals only)",
     "tokens per character of the workloads' code, JSON and prose under both vocabularies"),
    ("Latency grows with the context", "001 §为什么要缓存",
     "the TTFT curve (report, `ttft_curve.png`) shows it; the verdict table reads token counts only",
     "a verdict over the curve's cold TTFT per length (timed, so machine-dependent)"),
    ("The static zone is shared across users", "001 §静态与动态的分离",
     "{row:The static zone is reused across sessions} measures it across sessions on one engine; across tenants kvreuse isolates caches by design "
     "(`benchmarks/results/tenant_isolation.json`)", "the server with a shared-prefix tenant policy"),
    ("A broken cache multiplies latency", "003 §KV Cache 友好的上下文设计",
     "the timed section (TTFT rounds) gives it per pattern; the verdict table reads token counts only",
     "a verdict over the TTFT medians of timestamp_start vs append_only (timed)"),
    ("Attention compute per request grows quadratically with the context", "003 §KV Cache 的原理与约束",
     "the FLOP model (`cost.py`) is quadratic by definition, so a row would restate the formula; {row:Without a cache, prefill grows} "
     "judges the session total", "timed prefill at several lengths on a model where attention dominates"),
    ("Skills way 3 (metadata, full text by a tool) vs way 2 (read as a file)", "003 §Skills 的实现方式与权衡",
     "both append the skill where it is loaded, so their cache cost is the message arm of {row:A skill loaded into the system prompt}; what differs is "
     "instruction following", "a trained model's adherence to the skill, by delivery way"),
    ("Full compaction in two stages (session memory first, then full)", "003 §生产级的分层压缩机制",
     "not built: `compression.py` has one full-compaction stage", "a two-stage layer beside compress_l5_full"),
    ("Retention priorities: decisions, modified files, pass/fail, TODOs survive compression",
     "003 §对 Agent 架构设计的启示", "not built: {row:Identifiers (UUIDs} checks identifiers only",
     "a text check like {row:Identifiers (UUIDs}'s over labelled decisions, files, verdicts and TODOs in the workloads"),
    ("Isolation vs an actual compression arm", "003 §隔离优于压缩：子 Agent 上下文隔离",
     "{row:Isolation beats compression} compares delegation with the same search in the main thread, uncompressed",
     "explore_inline with the compression layers on, beside the delegated run"),
]  # fmt: skip
