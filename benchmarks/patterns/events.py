"""Patterns for mid-session events: tools that appear or are toggled, a skill loaded, the date changing,
sub-agents with their own system prompt.  Each comes as a pair that does the same thing two ways.

Events happen at fixed points of the main thread (a third and two thirds of its turns), so every pair
member sees the same event at the same request.
"""

from __future__ import annotations

import copy

from kvreuse.benchmarks.patterns.request import BASE_KWARGS, Request, append_only, system_message
from kvreuse.benchmarks.workloads import Message, Trajectory
from kvreuse.benchmarks.workloads.prompts import _fn, _s


def event_turns(traj: Trajectory) -> tuple[int, int]:
    """Request indices (main thread) of the first and second event."""
    main = [k for k, t in enumerate(traj.turns) if t.thread == 0]
    return main[len(main) // 3], main[2 * len(main) // 3]


MCP_TOOLS = [
    _fn(f"mcp__browser_{verb}", f"Browser automation (MCP server 'browser'): {what}.", {"target": _s(arg)}, ["target"])
    for verb, what, arg in (
        ("click", "click an element of the current page", "CSS selector of the element."),
        ("navigate", "open a URL in the controlled browser tab", "Absolute URL."),
        ("snapshot", "return the accessibility tree of the current page", "Frame name, or 'main'."),
    )
]  # fmt: skip


def _name(tool: dict) -> str:
    return tool["function"]["name"]


def _with(traj: Trajectory, k: int, tools: list[dict]) -> Request:
    return Request([system_message(traj), *traj.history(k)], tools, dict(BASE_KWARGS))


def tools_dynamic_after(traj: Trajectory, k: int) -> Request:
    """Stable tools sorted by name, then (once an MCP server connects) its tools sorted, after them."""
    stable = sorted(traj.tools, key=_name)
    dynamic = MCP_TOOLS if k >= event_turns(traj)[0] else []
    return _with(traj, k, stable + sorted(dynamic, key=_name))


def tools_dynamic_sorted_in(traj: Trajectory, k: int) -> Request:
    """Every tool in one list sorted by name, so the MCP tools land among the stable ones."""
    dynamic = MCP_TOOLS if k >= event_turns(traj)[0] else []
    return _with(traj, k, sorted([*traj.tools, *dynamic], key=_name))


def _toggled_tool(traj: Trajectory) -> dict:
    return traj.tools[len(traj.tools) // 2]


def tools_toggled(traj: Trajectory, k: int) -> Request:
    """A capability switched off between the two events: its schema is withdrawn, then restored."""
    a, b = event_turns(traj)
    off = _toggled_tool(traj)
    tools = [t for t in traj.tools if t is not off] if a <= k < b else list(traj.tools)
    return _with(traj, k, tools)


def _reminder(text: str) -> Message:
    return {"role": "user", "content": f"<system-reminder>{text}</system-reminder>"}


def _insert_at(traj: Trajectory, k: int, extra: dict[int, list[Message]]) -> list[Message]:
    """The thread's history with ``extra[j]`` messages placed after turn j's new messages, forever."""
    msgs: list[Message] = []
    for j in traj.thread_turns(k):
        msgs += copy.deepcopy(traj.turns[j].new)
        msgs += extra.get(j, [])
        if j != k:
            msgs.append(copy.deepcopy(traj.turns[j].assistant))
    return msgs


def tools_toggle_message(traj: Trajectory, k: int) -> Request:
    """The same toggle told in the conversation: schemas untouched, a reminder appended at each switch."""
    a, b = event_turns(traj)
    name = _name(_toggled_tool(traj))
    extra = {
        a: [_reminder(f"The `{name}` tool is disabled by the user; do not call it.")],
        b: [_reminder(f"The `{name}` tool is available again.")],
    }
    hist = _insert_at(traj, k, extra) if traj.turns[k].thread == 0 else traj.history(k)
    return Request([system_message(traj), *hist], traj.tools, dict(BASE_KWARGS))


SKILL_TEXT = "\n".join(
    [
        "---",
        "name: migrations",
        "description: Write and check Alembic database migrations. Use when a model or table changes.",
        "---",
        "# Writing a migration",
    ]
    + [
        f"{i}. {step} Run `alembic upgrade head` on a scratch database and then `alembic downgrade -1`; "
        "both must succeed before the migration is committed. Never edit a migration that was released."
        for i, step in enumerate(
            [
                "Generate the revision with `alembic revision --autogenerate -m <message>`.",
                "Read the generated file: autogenerate misses server defaults, enum changes and renames.",
                "Add data migrations as separate revisions, batched in chunks of 10,000 rows.",
                "Give every new non-null column a server default, then drop the default in a later revision.",
                "Create indexes concurrently on tables over a million rows.",
                "Write the downgrade; if it cannot be lossless, say so in the docstring.",
            ]
            * 3,
            start=1,
        )
    ]
)


def skill_in_system(traj: Trajectory, k: int) -> Request:
    """A skill loaded at the first event and written into the end of the system prompt from then on."""
    loaded = k >= event_turns(traj)[0] and traj.turns[k].thread == 0
    sys = system_message(traj, suffix="\n\n# Active skill\n" + SKILL_TEXT if loaded else "")
    return Request([sys, *traj.history(k)], traj.tools, dict(BASE_KWARGS))


def skill_in_messages(traj: Trajectory, k: int) -> Request:
    """The same skill delivered in the conversation (as a skill tool's result is), where it was loaded."""
    a = event_turns(traj)[0]
    if traj.turns[k].thread != 0:
        return append_only(traj, k)
    hist = _insert_at(traj, k, {a: [{"role": "user", "content": f"<skill>\n{SKILL_TEXT}\n</skill>"}]})
    return Request([system_message(traj), *hist], traj.tools, dict(BASE_KWARGS))


def _date(traj: Trajectory, k: int) -> str:
    return "2025-09-15" if k >= event_turns(traj)[1] else "2025-09-14"


def date_in_system(traj: Trajectory, k: int) -> Request:
    """Today's date (no time) as the last line of the system prompt; the session crosses midnight once."""
    sys = system_message(traj, suffix=f"\n\nToday's date is {_date(traj, k)}.")
    return Request([sys, *traj.history(k)], traj.tools, dict(BASE_KWARGS))


def date_in_messages(traj: Trajectory, k: int) -> Request:
    """The date as a reminder message: one at the start, one more when it changes, none ever removed."""
    first = traj.thread_turns(k)[0]
    extra = {first: [_reminder(f"Today's date is {_date(traj, first)}.")]}
    b = event_turns(traj)[1]
    if traj.turns[k].thread == 0 and k >= b:
        extra.setdefault(b, []).append(_reminder(f"Today's date is {_date(traj, b)}."))
    return Request([system_message(traj), *_insert_at(traj, k, extra)], traj.tools, dict(BASE_KWARGS))


SUBAGENT_SYSTEM = (
    "You are a read-only search agent working for another agent in /workspace/ledgerly. Answer its question "
    "with path:line references and a one-paragraph conclusion; never edit files.\nPlatform: linux"
)


def subagent_own_system(traj: Trajectory, k: int) -> Request:
    """Sub-agents (threads > 0) get their own short system prompt and the parent's tools (like with like:
    only the system prompt differs from the aligned sub-agents)."""
    if traj.turns[k].thread == 0:
        return append_only(traj, k)
    msgs = [{"role": "system", "content": SUBAGENT_SYSTEM}, *traj.history(k)]
    return Request(msgs, traj.tools, dict(BASE_KWARGS))


def tools_first(source: str) -> str:
    """The Qwen3 template with the tool block before the system text (the order Anthropic's API uses)."""
    head = "{{- messages[0].content + '\\n\\n' }}"
    tools_end = '</tool_call><|im_end|>\\n" }}'
    if head not in source or tools_end not in source:
        raise ValueError("tools_first: not the bundled Qwen3 template")
    src = source.replace(head, "", 1)
    tail = (
        "</tool_call>\" }}\n    {%- if messages[0].role == 'system' %}{{- '\\n\\n' + messages[0].content }}"
        "{%- endif %}\n    {{- '<|im_end|>\\n' }}"
    )
    return src.replace(tools_end, tail, 1)
