"""Patterns that rewrite the history: sliding window, compression, text flattening, reasoning stripping."""

from __future__ import annotations

import json

from kvreuse.benchmarks.patterns.request import (
    BASE_KWARGS,
    Request,
    append_only,
    pair_safe_start,
    system_message,
)
from kvreuse.benchmarks.workloads import Message, Trajectory

WINDOW_MESSAGES = 8
RESULT_BUDGET_CHARS = 6000  # tool-result characters kept verbatim before the oldest become stubs
SUMMARY_THRESHOLD_CHARS = 12000  # history size at which everything but the recent tail is summarised
SUMMARY_KEEP_MESSAGES = 4


def sliding_window(traj: Trajectory, k: int) -> Request:
    """Keep only the last WINDOW_MESSAGES messages, never keeping a tool result without its call."""
    hist = traj.history(k)
    start = pair_safe_start(hist, max(0, len(hist) - WINDOW_MESSAGES))
    return Request([system_message(traj), *hist[start:]], traj.tools, dict(BASE_KWARGS))


def sliding_window_5(traj: Trajectory, k: int) -> Request:
    """Experiment 2-3's sliding window: the last 5 messages (tool pairs kept)."""
    hist = traj.history(k)
    start = pair_safe_start(hist, max(0, len(hist) - 5))
    return Request([system_message(traj), *hist[start:]], traj.tools, dict(BASE_KWARGS))


def _stub(msg: Message) -> Message:
    first = msg["content"].splitlines()[0][:80] if msg["content"] else ""
    content = f"[{msg.get('name', 'tool')} result moved out of context: {len(msg['content'])} chars; starts: {first}]"
    return {**msg, "content": content}


def compress_budget(traj: Trajectory, k: int) -> Request:
    """Tool-result budget: once verbatim results exceed the budget, the oldest become stubs.

    Replacement decisions are frozen once made (replayed from the thread's first turn), and each
    trigger stubs down to half the budget so the cache breaks in batches, not every turn.
    """
    stubbed, _ = _stubbed_budget(traj, k)
    hist = traj.history(k)
    msgs = [_stub(m) if i in stubbed else m for i, m in enumerate(hist)]
    return Request([system_message(traj), *msgs], traj.tools, dict(BASE_KWARGS))


def _history_chars(hist: list[Message]) -> int:
    return sum(len(m.get("content") or "") + len(json.dumps(m.get("tool_calls") or [])) for m in hist)


def summary_text(msgs: list[Message]) -> str:
    """A deterministic stand-in for an LLM summary: every call made and the first line of each result."""
    lines = ["[summary of earlier work]"]
    for m in msgs:
        if m["role"] == "user":
            lines.append(f"- user asked: {m['content'][:160]}")
        for call in m.get("tool_calls") or []:
            lines.append(f"- called {call['function']['name']} {call['function']['arguments'][:100]}")
        if m["role"] == "tool":
            lines.append(f"  -> {(m['content'].splitlines() or [''])[0][:100]}")
    return "\n".join(lines)


def compress_summary(traj: Trajectory, k: int) -> Request:
    """One summary: the first time the history passes the threshold, all but the tail is summarised."""
    cut = None
    for j in traj.thread_turns(k):
        hist = traj.history(j)
        if _history_chars(hist) > SUMMARY_THRESHOLD_CHARS:
            cut = pair_safe_start(hist, len(hist) - SUMMARY_KEEP_MESSAGES)
            break
    hist = traj.history(k)
    if cut is not None:
        hist = [{"role": "user", "content": summary_text(hist[:cut])}, *hist[cut:]]
    return Request([system_message(traj), *hist], traj.tools, dict(BASE_KWARGS))


def _as_text(m: Message) -> str:
    if m["role"] == "user":
        return f"USER: {m['content']}"
    if m["role"] == "tool":
        return f"TOOL ({m.get('name', 'tool')}): {m['content']}"
    parts = [f"ASSISTANT: {m.get('content') or ''}"]
    if m.get("reasoning_content"):
        parts.insert(0, f"ASSISTANT (thinking): {m['reasoning_content']}")
    for call in m.get("tool_calls") or []:
        parts.append(f"CALL {call['function']['name']}({call['function']['arguments']})")
    return "\n".join(parts)


def text_stable(traj: Trajectory, k: int) -> Request:
    """History flattened into one user message of USER:/ASSISTANT: text, formatted identically every turn."""
    body = "\n\n".join(_as_text(m) for m in traj.history(k))
    return Request([system_message(traj), {"role": "user", "content": body}], traj.tools, dict(BASE_KWARGS))


def text_unstable(traj: Trajectory, k: int) -> Request:
    """The same flattening, but each entry is labelled [i/N], so every label changes when N grows."""
    hist = traj.history(k)
    body = "\n\n".join(f"[{i + 1}/{len(hist)}] {_as_text(m)}" for i, m in enumerate(hist))
    return Request([system_message(traj), {"role": "user", "content": body}], traj.tools, dict(BASE_KWARGS))


def reasoning_stripped(traj: Trajectory, k: int) -> Request:
    """Qwen3's default: reasoning of assistant turns before the latest user query is dropped from history."""
    req = append_only(traj, k)
    return Request(req.messages, req.tools, {**req.template_kwargs, "keep_reasoning": False})


def sliding_window_block(traj: Trajectory, k: int) -> Request:
    """A window of WINDOW_MESSAGES that, when full, drops its older half at once (cut moves in blocks)."""
    hist = traj.history(k)
    step = WINDOW_MESSAGES // 2
    cut = 0 if len(hist) <= WINDOW_MESSAGES else (len(hist) - step) // step * step
    start = pair_safe_start(hist, cut)
    return Request([system_message(traj), *hist[start:]], traj.tools, dict(BASE_KWARGS))


def _stubbed_budget(traj: Trajectory, k: int) -> tuple[set[int], dict[int, int]]:
    """compress_budget's frozen decisions, and the request at which each result was stubbed."""
    stubbed: set[int] = set()
    when: dict[int, int] = {}
    for j in traj.thread_turns(k):
        hist = traj.history(j)
        live = [i for i, m in enumerate(hist) if m["role"] == "tool" and i not in stubbed]
        size = sum(len(hist[i]["content"]) for i in live)
        if size > RESULT_BUDGET_CHARS:
            for i in live:
                if size <= RESULT_BUDGET_CHARS // 2:
                    break
                stubbed.add(i)
                when[i] = j
                size -= len(hist[i]["content"])
    return stubbed, when


def compress_unfrozen(traj: Trajectory, k: int) -> Request:
    """compress_budget's decisions, but each stub is re-rendered with a live 'stubbed N turns ago' note."""
    stubbed, when = _stubbed_budget(traj, k)
    hist = traj.history(k)
    age = {i: len([j for j in traj.thread_turns(k) if j > when[i]]) for i in stubbed}
    msgs = [
        {**_stub(m), "content": _stub(m)["content"] + f" (stubbed {age[i]} turns ago)"} if i in stubbed else m
        for i, m in enumerate(hist)
    ]
    return Request([system_message(traj), *msgs], traj.tools, dict(BASE_KWARGS))


KEEP_RESULTS = 2  # compress_every_turn keeps this many latest tool results verbatim


def compress_every_turn(traj: Trajectory, k: int) -> Request:
    """Every request stubs all tool results but the latest KEEP_RESULTS (the boundary moves each turn)."""
    hist = traj.history(k)
    results = [i for i, m in enumerate(hist) if m["role"] == "tool"]
    old = set(results[:-KEEP_RESULTS]) if len(results) > KEEP_RESULTS else set()
    msgs = [_stub(m) if i in old else m for i, m in enumerate(hist)]
    return Request([system_message(traj), *msgs], traj.tools, dict(BASE_KWARGS))


COMPACT_FRACTION = 0.45  # compaction threshold as a fraction of the thread's final history size
COMPACT_KEEP_MESSAGES = 6


def compact_threshold(traj: Trajectory, k: int) -> Request:
    """Claude Code-style compaction: when the live context passes the threshold, everything but the recent
    tail is replaced by one summary; the next compaction waits until the context has grown by another half
    threshold (so it happens in batches, not every turn once a long tail keeps it above the limit)."""
    thread = traj.thread_turns(k)
    last = max(j for j, t in enumerate(traj.turns) if t.thread == traj.turns[k].thread)
    limit = COMPACT_FRACTION * _history_chars(traj.history(last))
    cut, summary = 0, None
    for j in thread:
        hist = traj.history(j)
        live = ([summary] if summary else []) + hist[cut:]
        if _history_chars(live) > limit:
            new_cut = pair_safe_start(hist, len(hist) - COMPACT_KEEP_MESSAGES)
            if new_cut > cut:
                summary = {"role": "user", "content": summary_text(hist[:new_cut])}
                cut = new_cut
                live = [summary, *hist[cut:]]
            limit = max(limit, _history_chars(live) + limit / 2)
    hist = traj.history(k)
    return Request(
        [system_message(traj), *([summary] if summary else []), *hist[cut:]], traj.tools, dict(BASE_KWARGS)
    )
