"""Patterns that inject changing content: timestamps, a user profile, reordered tools, a status bar."""

from __future__ import annotations

import copy

from kvreuse.benchmarks.patterns.request import (
    BASE_KWARGS,
    Request,
    system_message,
    timestamp,
    tool_call_count,
    turn_rng,
)
from kvreuse.benchmarks.workloads import Message, Trajectory


def timestamp_start(traj: Trajectory, k: int) -> Request:
    """'Current time: ...' as the first line of the system prompt, updated every request."""
    sys = system_message(traj, prefix=f"Current time: {timestamp(traj, k)}\n\n")
    return Request([sys, *traj.history(k)], traj.tools, dict(BASE_KWARGS))


def timestamp_end(traj: Trajectory, k: int) -> Request:
    """The same timestamp as the last line of the system prompt."""
    sys = system_message(traj, suffix=f"\n\nCurrent time: {timestamp(traj, k)}")
    return Request([sys, *traj.history(k)], traj.tools, dict(BASE_KWARGS))


def user_profile(traj: Trajectory, k: int) -> Request:
    """A user-profile message right after the system prompt, with live quota and balance figures."""
    rng = turn_rng(traj, k, salt=2)
    profile = (
        "[user profile] name: Dana Ruiz | plan: team | region: eu-west-1 | "
        f"API calls left today: {4870 - 13 * k - rng.randint(0, 9)} | "
        f"credit balance: ${125.40 - 0.37 * k - rng.random():.2f} | last active: {timestamp(traj, k)}"
    )
    msgs = [system_message(traj), {"role": "user", "content": profile}, *traj.history(k)]
    return Request(msgs, traj.tools, dict(BASE_KWARGS))


def tools_reordered(traj: Trajectory, k: int) -> Request:
    """The same tool set in a new (seeded) order every request, as 'most used first' ranking does."""
    tools = list(traj.tools)
    turn_rng(traj, k, salt=3).shuffle(tools)
    return Request(append_only_messages(traj, k), tools, dict(BASE_KWARGS))


def append_only_messages(traj: Trajectory, k: int) -> list[Message]:
    return [system_message(traj), *traj.history(k)]


def status_text(traj: Trajectory, k: int) -> str:
    """The agent status bar for request ``k``: progress counters and a checklist of steps."""
    turns = traj.thread_turns(k)
    done = min(3, len(turns) // 3)
    todo = " ".join(
        f"[{'x' if i < done else ' '}] {step}" for i, step in enumerate(("explore", "change", "verify"))
    )
    return (
        f"<status>step {len(turns)} | tool calls so far: {tool_call_count(traj, k)} | "
        f"time: {timestamp(traj, k)} | todo: {todo}</status>"
    )


def _status_msg(traj: Trajectory, k: int) -> Message:
    return {"role": "user", "content": status_text(traj, k)}


def status_replace(traj: Trajectory, k: int) -> Request:
    """One status message at the end, removed and re-added every request (only the latest is shown)."""
    return Request([*append_only_messages(traj, k), _status_msg(traj, k)], traj.tools, dict(BASE_KWARGS))


def status_append(traj: Trajectory, k: int) -> Request:
    """A new status message appended after each turn's new messages and never removed."""
    msgs: list[Message] = [system_message(traj)]
    for j in traj.thread_turns(k):
        msgs += traj.turns[j].new
        msgs.append(_status_msg(traj, j))
        if j != k:
            msgs.append(traj.turns[j].assistant)
    return Request(copy.deepcopy(msgs), traj.tools, dict(BASE_KWARGS))


def status_in_system(traj: Trajectory, k: int) -> Request:
    """The status bar written into the end of the system prompt."""
    sys = system_message(traj, suffix="\n\n" + status_text(traj, k))
    return Request([sys, *traj.history(k)], traj.tools, dict(BASE_KWARGS))
