"""[003]'s five compression layers (生产级的分层压缩机制), alone and stacked, with full compaction's
circuit breaker.  Deterministic stand-ins for the LLM steps; every decision is replayed from the
thread's first turn so it is frozen once made (the cache sees a rewrite only when a layer fires).

1. tool-result budget: a result over ``BUDGET_CHARS`` never enters verbatim; the model sees a preview
   and a saved-file path (decided when the result arrives, so it never breaks the prefix);
2. noise deletion: search results are removed outright (no summary) once the context passes ``T1``;
3. API micro-compaction: all tool results but the last ``KEEP`` cleared once the context passes ``T1``;
4. archival summary: each older turn replaced by its own one-line record (git log, not squash) past ``T2``;
5. full compaction past ``T3``: one summary of all but the tail; an attempt whose summary is not shorter
   fails and leaves the history as is; after ``BREAKER`` consecutive failures no more attempts are made.
Thresholds are fractions of the thread's final append-only history size, so every workload triggers them.
"""

from __future__ import annotations

from typing import Any

from kvreuse.benchmarks.patterns.history import _history_chars, summary_text
from kvreuse.benchmarks.patterns.request import BASE_KWARGS, Request, pair_safe_start, system_message
from kvreuse.benchmarks.workloads import Message, Trajectory

BUDGET_CHARS = 1500
PREVIEW_CHARS = 300
T1, T2, T3 = 0.35, 0.45, 0.55  # fractions of the thread's final history size
KEEP = 2
BREAKER = 3
SEARCH_TOOLS = ("web_search", "grep", "find", "glob", "search")


def _budget(m: Message, call_id: str) -> Message:
    if m["role"] != "tool" or len(m["content"]) <= BUDGET_CHARS:
        return m
    preview = m["content"][:PREVIEW_CHARS]
    return {**m, "content": f"{preview}\n[... {len(m['content']):,} chars; full output saved to "
                            f"/tmp/tool-results/{call_id}.txt]"}  # fmt: skip


def _archive_line(i: int, m: Message) -> str:
    calls = ", ".join(
        f"{c['function']['name']}({c['function']['arguments'][:80]})" for c in m.get("tool_calls") or []
    )
    if m["role"] == "tool":
        return f"  {i}: {m.get('name', 'tool')} -> {(m['content'].splitlines() or [''])[0][:100]}"
    return f"  {i}: {m['role']}: {(m.get('content') or '')[:100]}{' calls ' + calls if calls else ''}"


class _State:
    """The frozen decisions of one thread up to a request."""

    def __init__(self) -> None:
        self.noise: set[int] = set()
        self.cleared: set[int] = set()
        self.archived = 0  # messages [0, archived) replaced by their one-line records
        self.cut = 0  # messages [0, cut) replaced by one full summary
        self.summary: str | None = None
        self.failures = 0
        self.attempts = 0


def _view(hist: list[Message], s: _State, layers: frozenset[int]) -> list[Message]:
    out: list[Message] = []
    if s.summary is not None:
        out.append({"role": "user", "content": s.summary})
    if s.archived > s.cut:
        lines = [_archive_line(i, hist[i]) for i in range(s.cut, s.archived)]
        out.append({"role": "user", "content": "[archived turns]\n" + "\n".join(lines)})
    for i in range(max(s.cut, s.archived), len(hist)):
        m = hist[i]
        if 1 in layers:
            m = _budget(m, m.get("tool_call_id", str(i)))
        if i in s.noise:  # removed outright; its call stays answered by a note, so pairs stay valid
            m = {**m, "content": "[search results removed as noise]"}
        elif i in s.cleared:
            m = {**m, "content": "[tool result cleared]"}
        out.append(m)
    return out


def compressed(traj: Trajectory, k: int, layers: frozenset[int]) -> tuple[list[Message], _State]:
    thread = traj.thread_turns(k)
    last = max(j for j, t in enumerate(traj.turns) if t.thread == traj.turns[k].thread)
    full = _history_chars(traj.history(last))
    s = _State()
    for j in thread:
        hist = traj.history(j)
        size = _history_chars(_view(hist, s, layers))
        if size > T1 * full and (2 in layers or 3 in layers):
            tools = [i for i, m in enumerate(hist) if m["role"] == "tool"]
            if 2 in layers:
                s.noise |= {i for i in tools[:-KEEP] if hist[i].get("name") in SEARCH_TOOLS}
            if 3 in layers:
                s.cleared |= {i for i in tools[:-KEEP] if i not in s.noise}
            size = _history_chars(_view(hist, s, layers))
        if size > T2 * full and 4 in layers:
            s.archived = max(s.archived, pair_safe_start(hist, len(hist) - 2 * KEEP))
            size = _history_chars(_view(hist, s, layers))
        if size > T3 * full and 5 in layers and s.failures < BREAKER:
            cut = pair_safe_start(hist, len(hist) - 2 * KEEP)
            if cut > s.cut:
                s.attempts += 1
                text = summary_text(_view(hist[:cut], s, layers))
                if len(text) < _history_chars(_view(hist, s, layers)[: max(1, cut - s.cut)]):
                    s.summary, s.cut, s.archived, s.failures = text, cut, max(s.archived, cut), 0
                else:
                    s.failures += 1
    return _view(traj.history(k), s, layers), s


def builder(layers: tuple[int, ...]) -> Any:
    chosen = frozenset(layers)

    def build(traj: Trajectory, k: int) -> Request:
        msgs, _ = compressed(traj, k, chosen)
        return Request([system_message(traj), *msgs], traj.tools, dict(BASE_KWARGS))

    build.__doc__ = f"compression layers {sorted(chosen)}"
    return build


LAYER_PATTERNS = {
    "compress_l1_budget": (1,),
    "compress_l2_noise": (2,),
    "compress_l3_micro": (3,),
    "compress_l4_archive": (4,),
    "compress_l5_full": (5,),
    "compress_layered": (1, 2, 3, 4, 5),
}
