"""Session rewrites: patterns whose agent *acts* differently (an extra tool call, a search done in the
main thread, a second session on a warm engine) change the trajectory itself, not only its rendering.
A pattern's ``session`` hook maps the loaded trajectory to the one it replays (replies included).
"""

from __future__ import annotations

import copy

from kvreuse.benchmarks.patterns.request import timestamp
from kvreuse.benchmarks.workloads import Message, Trajectory, Turn
from kvreuse.benchmarks.workloads.prompts import _fn, _s

TIME_TOOL = _fn(
    "get_current_time",
    "Get the current date and time in a specific timezone.",
    {"timezone": _s("Timezone name, e.g. America/Vancouver.")},
    [],
)


def _event_turns(traj: Trajectory) -> tuple[int, int]:
    from kvreuse.benchmarks.patterns.events import event_turns

    return event_turns(traj)


def _next_in_thread(traj: Trajectory, k: int) -> int | None:
    return next(
        (j for j in range(k + 1, len(traj.turns)) if traj.turns[j].thread == traj.turns[k].thread), None
    )


def with_time_tool(traj: Trajectory) -> Trajectory:
    """The agent asks a ``get_current_time`` tool at the two event turns; the result opens its next turn."""
    turns = list(traj.turns)
    for n, k in enumerate(_event_turns(traj)):
        nxt = _next_in_thread(traj, k)
        if nxt is None:
            continue
        call_id = f"call_time_{n}"
        asst = copy.deepcopy(turns[k].assistant)
        asst["tool_calls"] = [
            *(asst.get("tool_calls") or []),
            {"id": call_id, "type": "function", "function": {"name": "get_current_time", "arguments": "{}"}},
        ]
        result = {"role": "tool", "tool_call_id": call_id, "name": "get_current_time",
                  "content": f'{{"datetime": "{timestamp(traj, nxt)}", "timezone": "UTC"}}'}  # fmt: skip
        turns[k] = Turn(turns[k].thread, turns[k].new, asst)
        turns[nxt] = Turn(turns[nxt].thread, [*turns[nxt].new, result], turns[nxt].assistant)
    return Trajectory(traj.name, traj.variant, traj.seed, traj.system, [*traj.tools, TIME_TOOL], turns)


def _merge(report: Message, then: Message) -> Message:
    """A final report followed, in the same assistant message, by the next step's tool calls."""
    out = copy.deepcopy(then)
    out["content"] = "\n\n".join(x for x in (report.get("content"), then.get("content")) if x)
    if report.get("reasoning_content"):
        out["reasoning_content"] = report["reasoning_content"]
    return out


def inline_exploration(traj: Trajectory) -> Trajectory:
    """The sub-agents' searches done by the main agent in its own thread (no delegation): each sub-agent's
    turns join thread 0, its report becomes the main agent's text, and the main thread carries on from
    where the sub-agents' reports came back."""
    subs = sorted({t.thread for t in traj.turns if t.thread > 0})
    if not subs:
        raise ValueError("inline_exploration: the workload has no sub-agent threads")
    main = [t for t in traj.turns if t.thread == 0]
    back = next(i for i, t in enumerate(main) if i > 0)  # the turn that received the sub-agents' reports
    chain: list[list[Turn]] = [[t for t in traj.turns if t.thread == s] for s in subs]
    turns: list[Turn] = []
    pending_new: list[Message] = copy.deepcopy(main[0].new)
    for c, sub in enumerate(chain):
        for i, t in enumerate(sub):
            new = pending_new if i == 0 else copy.deepcopy(t.new)
            asst = copy.deepcopy(t.assistant)
            last = i == len(sub) - 1
            if last:
                after = chain[c + 1][0].assistant if c + 1 < len(chain) else main[back].assistant
                asst = _merge(asst, after)
            turns.append(Turn(0, new, asst))
            pending_new = []
        # the next sub-agent's first step was merged into this report; its own first turn is skipped
        if c + 1 < len(chain):
            chain[c + 1] = chain[c + 1][1:] if len(chain[c + 1]) > 1 else chain[c + 1]
    turns += [Turn(0, copy.deepcopy(t.new), copy.deepcopy(t.assistant)) for t in main[back + 1 :]]
    return Trajectory(traj.name, traj.variant, traj.seed, traj.system, traj.tools, turns)


SESSION_TASKS = [
    "The nightly export to the accounting system is missing refunds issued after 23:00 UTC. Find out why.",
    "Add a `--dry-run` flag to the payout command that prints what would be paid without paying it.",
]


def more_sessions(traj: Trajectory) -> Trajectory:
    """Three sessions of the same agent (same system prompt and tools) one after another on one engine:
    session 0 is the workload (with its sub-agents, if any); sessions 1 and 2 replay its first turns with
    another user task, on threads after the workload's own."""
    turns = list(traj.turns)
    first = [t for t in traj.turns if t.thread == 0][:3]
    base = max(t.thread for t in traj.turns)
    for s, task in enumerate(SESSION_TASKS, start=1):
        for i, t in enumerate(first):
            new = [{"role": "user", "content": task}] if i == 0 else copy.deepcopy(t.new)
            turns.append(Turn(base + s, new, copy.deepcopy(t.assistant)))
    return Trajectory(traj.name, traj.variant, traj.seed, traj.system, traj.tools, turns)


def session_of(traj: Trajectory, k: int) -> int:
    """Which session request k belongs to (``more_sessions``): 0 for the workload's own threads (its
    sub-agents included), i for the thread that opens with SESSION_TASKS[i - 1]."""
    first = traj.turns[traj.thread_turns(k)[0]].new
    text = first[0].get("content") if first else None
    return SESSION_TASKS.index(text) + 1 if text in SESSION_TASKS else 0
