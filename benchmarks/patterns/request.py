"""What a pattern produces for one turn, and the helpers every pattern shares."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from kvreuse.benchmarks.workloads import Message, Trajectory

# Every pattern renders history with its reasoning, exactly as it was generated, unless the pattern
# under test is the reasoning one; otherwise Qwen3's default stripping would break append-only.
BASE_KWARGS: dict[str, Any] = {"keep_reasoning": True}


class Request(NamedTuple):
    """One chat request: OpenAI-style messages, tool schemas, and chat-template keyword arguments."""

    messages: list[Message]
    tools: list[dict[str, Any]]
    template_kwargs: dict[str, Any]


def system_message(traj: Trajectory, suffix: str = "", prefix: str = "") -> Message:
    return {"role": "system", "content": prefix + traj.system + suffix}


def append_only(traj: Trajectory, k: int) -> Request:
    """The correct layout: static system prompt and tools, history only ever appended to."""
    return Request([system_message(traj), *traj.history(k)], traj.tools, dict(BASE_KWARGS))


def turn_rng(traj: Trajectory, k: int, salt: int) -> random.Random:
    """Randomness that depends only on the workload seed, the turn and the pattern (salt)."""
    return random.Random(traj.seed * 1_000_003 + k * 7919 + salt)


def timestamp(traj: Trajectory, k: int) -> str:
    """A wall-clock reading for turn ``k``: minutes apart, with microseconds, as agents print them."""
    base = datetime(2025, 9, 14, 10, 30, 0)
    rng = turn_rng(traj, k, salt=1)
    when = base + timedelta(seconds=k * 41 + rng.randint(0, 30), microseconds=rng.randint(0, 999_999))
    return when.strftime("%Y-%m-%d %H:%M:%S.%f")


def tool_call_count(traj: Trajectory, k: int) -> int:
    """Tool calls the thread of turn ``k`` has made before request ``k``."""
    return sum(len(traj.turns[j].assistant.get("tool_calls") or []) for j in traj.thread_turns(k)[:-1])


def pair_safe_start(messages: list[Message], start: int) -> int:
    """Move a cut point forward past tool results, so no kept result loses the call that asked for it."""
    while start < len(messages) and messages[start]["role"] == "tool":
        start += 1
    return start
