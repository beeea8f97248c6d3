"""Context-management patterns, each a pure ``(trajectory, turn_index) -> Request`` isolating one change.

``PATTERNS`` maps a short name to a :class:`Pattern`; ``cache=False`` marks the naive baseline,
which sends append-only requests to a target whose prefix cache is off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvreuse.benchmarks.patterns import compression, dynamic, events, history, layout, sessions, sweep
from kvreuse.benchmarks.patterns.ideal import ideal_prefill
from kvreuse.benchmarks.patterns.request import Request, append_only
from kvreuse.benchmarks.workloads import Trajectory


@dataclass(frozen=True)
class Pattern:
    """One context-management practice: how it builds each request, and the claim it tests."""

    name: str
    build: Callable[[Trajectory, int], Request]
    claim: str
    cache: bool = True
    template: Callable[[str], str] | None = None  # rewrites the stack's template source (qwen3 only)
    session: Callable[[Trajectory], Trajectory] | None = None  # the agent acts differently (sessions.py)

    def prepare(self, traj: Trajectory) -> Trajectory:
        """The trajectory this pattern replays: the workload's, or its ``session`` rewrite of it."""
        return self.session(traj) if self.session is not None else traj

    def requests(self, traj: Trajectory) -> list[Request]:
        return [self.build(traj, k) for k in range(len(traj.turns))]


_ALL = [
    Pattern("append_only", append_only, "append-only history, static prefix: should reach the ideal"),
    Pattern("naive", append_only, "baseline: append-only requests, prefix cache off", cache=False),
    Pattern("timestamp_start", dynamic.timestamp_start, "timestamp first in the system prompt"),
    Pattern("timestamp_end", dynamic.timestamp_end, "timestamp last in the system prompt"),
    Pattern("user_profile", dynamic.user_profile, "live user profile message right after the system prompt"),
    Pattern("tools_reordered", dynamic.tools_reordered, "same tools, shuffled every request"),
    Pattern("sliding_window", history.sliding_window, "baseline: last 8 messages, tool pairs kept"),
    Pattern("text_stable", history.text_stable, "history as USER:/ASSISTANT: text, byte-stable"),
    Pattern("text_unstable", history.text_unstable, "history as text with [i/N] labels that change"),
    Pattern("status_replace", dynamic.status_replace, "status bar at the end, replaced every request"),
    Pattern("status_append", dynamic.status_append, "status bar appended every request, never removed"),
    Pattern("status_in_system", dynamic.status_in_system, "status bar at the end of the system prompt"),
    Pattern("compress_budget", history.compress_budget, "old tool results replaced by stubs over a budget"),
    Pattern("compress_summary", history.compress_summary, "one summary of old history at a threshold"),
    Pattern("reasoning_stripped", history.reasoning_stripped, "Qwen3 default: old reasoning dropped"),
    Pattern(
        "sliding_window_block",
        history.sliding_window_block,
        "window of 8 that drops its older half when full",
    ),
    Pattern(
        "compress_every_turn",
        history.compress_every_turn,
        "all tool results but the last 2 stubbed, every turn",
    ),
    Pattern(
        "compress_unfrozen", history.compress_unfrozen, "compress_budget with stubs re-rendered each turn"
    ),
    Pattern(
        "compact_threshold", history.compact_threshold, "summary of all but the tail past a size threshold"
    ),
    Pattern(
        "tools_dynamic_after", events.tools_dynamic_after, "stable tools by name, MCP tools added after them"
    ),
    Pattern(
        "tools_dynamic_sorted_in", events.tools_dynamic_sorted_in, "all tools by name, MCP tools sorted in"
    ),
    Pattern("tools_toggled", events.tools_toggled, "a capability off then on: its schema withdrawn"),
    Pattern("tools_toggle_message", events.tools_toggle_message, "the same toggle as reminder messages"),
    Pattern("skill_in_system", events.skill_in_system, "a skill loaded into the system prompt"),
    Pattern("skill_in_messages", events.skill_in_messages, "the same skill as a message where it was loaded"),
    Pattern("date_in_system", events.date_in_system, "date-only line in the system prompt (changes once)"),
    Pattern("date_in_messages", events.date_in_messages, "the date as reminder messages, appended"),
    Pattern(
        "subagent_own_system",
        events.subagent_own_system,
        "sub-agents with their own short system prompt (same tools)",
    ),
    Pattern("timestamp_message", layout.timestamp_message, "the time appended as a new message every turn"),
    Pattern(
        "timestamp_tool",
        append_only,
        "the agent calls get_current_time when it needs the time",
        session=sessions.with_time_tool,
    ),
    Pattern("world_state_diff", layout.world_state_diff, "World State full once, changes as appended diffs"),
    Pattern(
        "world_state_rerender", layout.world_state_rerender, "World State full re-rendered every request"
    ),
    Pattern(
        "catalogue_in_prefix", layout.catalogue_in_prefix, "skill catalogue re-rendered when one is added"
    ),
    Pattern("catalogue_diff", layout.catalogue_diff, "skill catalogue fixed, an addition told by a message"),
    Pattern("skill_switch_system", layout.skill_switch_system, "skill A then B in the system prompt"),
    Pattern("skill_switch_messages", layout.skill_switch_messages, "skill A then B as appended messages"),
    Pattern("skill_reread", layout.skill_reread, "old history shows the skill file re-read as it is now"),
    Pattern("tools_deferred", layout.tools_deferred, "unused tools by name; a found schema as a message"),
    Pattern(
        "tools_deferred_schema", layout.tools_deferred_schema, "unused tools by name; a found schema in tools"
    ),
    Pattern(
        "explore_inline",
        append_only,
        "the sub-agents' searches done in the main thread",
        session=sessions.inline_exploration,
    ),
    Pattern(
        "session_env_in_system",
        layout.session_env_in_system,
        "3 sessions, each with its environment in the system prompt",
        session=sessions.more_sessions,
    ),
    Pattern(
        "session_env_message",
        layout.session_env_message,
        "3 sessions, each with its environment as the first message",
        session=sessions.more_sessions,
    ),
    Pattern("sliding_window_5", history.sliding_window_5, "Experiment 2-3's window: the last 5 messages"),
    Pattern(
        "timestamp_end_tools_first",
        dynamic.timestamp_end,
        "timestamp_end, template with tools before the system text",
        template=events.tools_first,
    ),
]
_ALL += [
    Pattern(f"status_{mode}_{n}", build(n), f"status bar of ~{n} tokens, {mode}d every request")
    for n in sweep.SIZES
    for mode, build in (("replace", sweep.replace_builder), ("append", sweep.append_builder))
]
_ALL += [
    Pattern(
        name,
        compression.builder(layers),
        f"compression layer(s) {', '.join(map(str, layers))} of [003]'s five",
    )
    for name, layers in compression.LAYER_PATTERNS.items()
]
PATTERNS: dict[str, Pattern] = {p.name: p for p in _ALL}


def select(names: str | None) -> list[Pattern]:
    """Patterns named in a comma-separated list (all when empty); unknown names raise ValueError."""
    if not names:
        return list(_ALL)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in PATTERNS]
    if unknown:
        raise ValueError(f"unknown pattern(s) {', '.join(unknown)}; known: {', '.join(PATTERNS)}")
    return [PATTERNS[n] for n in wanted]


__all__ = ["PATTERNS", "Pattern", "Request", "ideal_prefill", "select"]
