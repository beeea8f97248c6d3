"""Patterns for the request layouts of [000] and [001]: dynamic information as new messages, World State
full + diffs, a capability catalogue, deferred tools, history merged verbatim, skills switched, a
per-session environment block.  Each comes as a pair doing the same thing two ways; events happen at
the main thread's event turns (``events.event_turns``).
"""

from __future__ import annotations

from kvreuse.benchmarks.patterns.events import SKILL_TEXT, _insert_at, _name, _reminder, event_turns
from kvreuse.benchmarks.patterns.request import BASE_KWARGS, Request, append_only, system_message, timestamp
from kvreuse.benchmarks.patterns.sessions import session_of
from kvreuse.benchmarks.workloads import Message, Trajectory


def _main(traj: Trajectory, k: int) -> bool:
    return traj.turns[k].thread == 0


def timestamp_message(traj: Trajectory, k: int) -> Request:
    """[003]'s fix: the time appended as a new message after each turn's new messages, never removed."""
    extra = {j: [_reminder(f"Current time: {timestamp(traj, j)}")] for j in traj.thread_turns(k)}
    return Request([system_message(traj), *_insert_at(traj, k, extra)], traj.tools, dict(BASE_KWARGS))


# -- World State ([000] segment 5 full, diffs in segment 11) --------------------------------------------

_STATE = {"workspace": "/workspace/ledgerly", "permissions": "edit files, run tests; no network",
          "model": "main: qwen3-8b", "browser": "off", "web search": "off"}  # fmt: skip
_CHANGES = [
    ("web search", "on (enabled by the user)"),
    ("permissions", "edit files, run tests, network allowed"),
]


def _state_at(traj: Trajectory, k: int) -> dict[str, str]:
    state = dict(_STATE)
    for turn, (key, value) in zip(event_turns(traj), _CHANGES, strict=True):
        if k >= turn:
            state[key] = value
    return state


def _full(state: dict[str, str]) -> Message:
    body = "\n".join(f"{k}: {v}" for k, v in state.items())
    return {"role": "user", "content": f"<world-state full>\n{body}\n</world-state>"}


def world_state_diff(traj: Trajectory, k: int) -> Request:
    """The session's full World State once after the system prompt; each change a diff where it happened."""
    extra: dict[int, list[Message]] = {}
    if _main(traj, k):
        for turn, (key, value) in zip(event_turns(traj), _CHANGES, strict=True):
            extra[turn] = [{"role": "user", "content": f"<world-state diff>{key}: {value}</world-state>"}]
    hist = _insert_at(traj, k, extra)
    return Request([system_message(traj), _full(dict(_STATE)), *hist], traj.tools, dict(BASE_KWARGS))


def world_state_rerender(traj: Trajectory, k: int) -> Request:
    """The full World State re-rendered every request in the same place, with the current values."""
    state = _state_at(traj, k) if _main(traj, k) else dict(_STATE)
    return Request([system_message(traj), _full(state), *traj.history(k)], traj.tools, dict(BASE_KWARGS))


# -- capability catalogue ([000] segments 2-3) ------------------------------------------------------------

_CATALOGUE = [("pdf", "Read and fill PDF forms. Use when a task names a .pdf file."),
              ("xlsx", "Read and write spreadsheets. Use when a task names a .xlsx or .csv file."),
              ("release-notes", "Draft release notes from merged PRs. Use when asked for a changelog.")]  # fmt: skip
_INSTALLED = ("migrations", "Write and check Alembic migrations. Use when a model or table changes.")


def _catalogue(items: list[tuple[str, str]]) -> Message:
    body = "\n".join(f"- {n}: {d}" for n, d in items)
    return {"role": "user", "content": f"<skills-catalogue>\n{body}\n</skills-catalogue>"}


def catalogue_in_prefix(traj: Trajectory, k: int) -> Request:
    """The skill catalogue after the system prompt, re-rendered in place when a skill is installed."""
    items = [*_CATALOGUE, _INSTALLED] if _main(traj, k) and k >= event_turns(traj)[0] else _CATALOGUE
    return Request([system_message(traj), _catalogue(items), *traj.history(k)], traj.tools, dict(BASE_KWARGS))


def catalogue_diff(traj: Trajectory, k: int) -> Request:
    """The same catalogue, the installation told by a message where it happened."""
    extra = {event_turns(traj)[0]: [_reminder(f"Skill installed: {_INSTALLED[0]}: {_INSTALLED[1]}")]}
    hist = _insert_at(traj, k, extra if _main(traj, k) else {})
    return Request([system_message(traj), _catalogue(_CATALOGUE), *hist], traj.tools, dict(BASE_KWARGS))


# -- skills: switched, and old history re-read ([003] skills, [000] history merged verbatim) -------------

SKILL_B = SKILL_TEXT.replace("name: migrations", "name: api-review").replace(
    "Alembic database migrations", "HTTP API changes for backward compatibility"
)
SKILL_EDITED = SKILL_TEXT.replace("chunks of 10,000 rows", "chunks of 5,000 rows")


def _skill_msg(text: str) -> Message:
    return {"role": "user", "content": f"<skill>\n{text}\n</skill>"}


def skill_switch_system(traj: Trajectory, k: int) -> Request:
    """Skill A written into the system prompt at the first event, replaced by skill B at the second."""
    a, b = event_turns(traj)
    active = "" if not _main(traj, k) or k < a else SKILL_TEXT if k < b else SKILL_B
    sys = system_message(traj, suffix="\n\n# Active skill\n" + active if active else "")
    return Request([sys, *traj.history(k)], traj.tools, dict(BASE_KWARGS))


def skill_switch_messages(traj: Trajectory, k: int) -> Request:
    """The same switch as skill messages appended where each was loaded."""
    a, b = event_turns(traj)
    if not _main(traj, k):
        return append_only(traj, k)
    hist = _insert_at(traj, k, {a: [_skill_msg(SKILL_TEXT)], b: [_skill_msg(SKILL_B)]})
    return Request([system_message(traj), *hist], traj.tools, dict(BASE_KWARGS))


def skill_reread(traj: Trajectory, k: int) -> Request:
    """A skill loaded at the first event; after the second (a new Run) the history shows the skill file as
    it is now (edited), re-read, instead of the text the agent saw then."""
    a, b = event_turns(traj)
    if not _main(traj, k):
        return append_only(traj, k)
    text = SKILL_EDITED if k >= b else SKILL_TEXT
    return Request([system_message(traj), *_insert_at(traj, k, {a: [_skill_msg(text)]})], traj.tools,
                   dict(BASE_KWARGS))  # fmt: skip


# -- deferred tools ([001]: names in a message, schemas loaded on demand) --------------------------------


def _split_tools(traj: Trajectory) -> tuple[list[dict], list[dict]]:
    """(core, deferred): the tools the session calls stay up front; the others are deferred."""
    used = {c["function"]["name"] for t in traj.turns for c in (t.assistant.get("tool_calls") or [])}
    core = [t for t in traj.tools if _name(t) in used] or traj.tools[:1]
    return core, [t for t in traj.tools if t not in core]


def _deferred_list(deferred: list[dict]) -> Message:
    names = "\n".join(_name(t) for t in deferred)
    return {"role": "user", "content": f"<available-deferred-tools>\n{names}\n</available-deferred-tools>"}


def _search_result(tool: dict) -> Message:
    import json

    return {"role": "user", "content": f"<tool-search-result>\n{json.dumps(tool)}\n</tool-search-result>"}


def tools_deferred(traj: Trajectory, k: int) -> Request:
    """Only the tools the session uses as schemas; the rest listed by name; at the first event one deferred
    tool is discovered and its schema arrives as a message (the ``tools`` field never changes)."""
    core, deferred = _split_tools(traj)
    extra = {event_turns(traj)[0]: [_search_result(deferred[0])]} if deferred and _main(traj, k) else {}
    msgs = [system_message(traj), _deferred_list(deferred), *_insert_at(traj, k, extra)]
    return Request(msgs, core, dict(BASE_KWARGS))


def tools_deferred_schema(traj: Trajectory, k: int) -> Request:
    """The same discovery, but the found schema is added to the ``tools`` field from then on."""
    core, deferred = _split_tools(traj)
    found = deferred[:1] if deferred and _main(traj, k) and k >= event_turns(traj)[0] else []
    msgs = [system_message(traj), _deferred_list(deferred), *traj.history(k)]
    return Request(msgs, core + found, dict(BASE_KWARGS))


# -- a per-session environment block ([001] static vs dynamic zone) -------------------------------------


def _session_start(traj: Trajectory, k: int) -> int:
    """The request that opened request k's session (a sub-agent's session is its parent's)."""
    return traj.thread_turns(k)[0] if session_of(traj, k) else 0


def session_env_in_system(traj: Trajectory, k: int) -> Request:
    """Each session's environment (session id, start time) at the end of the system prompt: [001]'s dynamic
    zone, which sessions do not share."""
    session, first = session_of(traj, k), _session_start(traj, k)
    env = f"\n\n# Environment\nsession: s-{session:04d}\nstarted: {timestamp(traj, first)}\ncwd: /workspace/ledgerly"
    return Request([system_message(traj, suffix=env), *traj.history(k)], traj.tools, dict(BASE_KWARGS))


def session_env_message(traj: Trajectory, k: int) -> Request:
    """The same environment as the first message of each session, after the shared static prefix."""
    session, first = session_of(traj, k), _session_start(traj, k)
    env = f"# Environment\nsession: s-{session:04d}\nstarted: {timestamp(traj, first)}\ncwd: /workspace/ledgerly"
    msgs = [system_message(traj), _reminder(env), *traj.history(k)]
    return Request(msgs, traj.tools, dict(BASE_KWARGS))
