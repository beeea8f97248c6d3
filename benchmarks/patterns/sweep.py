"""[003]'s status-bar trade-off as a sweep: replace vs append, status size x session length, in prefilled
tokens and in money under both price tables; and the chapter's rule of thumb judged on it.

The rule of thumb (003 §状态更新的两种实现与缓存代价): append when updates are frequent and the trajectory
long; replace when the trajectory is short or one status message is large.
"""

from __future__ import annotations

from typing import Any

from kvreuse.benchmarks.patterns.dynamic import append_only_messages, status_text
from kvreuse.benchmarks.patterns.request import BASE_KWARGS, Request
from kvreuse.benchmarks.workloads import Message, Trajectory

SIZES = (65, 150, 300, 500)  # nominal status size in tokens (the report gives the measured size)
_STEPS = ["read the failing test", "trace the refund path", "check the currency rounding",
          "update the reconciliation handler", "add a regression test", "run the payout suite",
          "review the migration", "update the changelog"]  # fmt: skip


def sized_status(traj: Trajectory, k: int, tokens: int) -> str:
    """The status bar padded with a todo list to about ``tokens`` tokens (~2.85 characters a token, measured on the Qwen3 vocabulary)."""
    text = status_text(traj, k)
    items, i = [], 0
    while len(text) + sum(len(x) + 1 for x in items) < tokens * 2.85:
        done = "x" if i < len(traj.thread_turns(k)) else " "
        items.append(f"[{done}] {i + 1}. {_STEPS[i % len(_STEPS)]}")
        i += 1
    return text if not items else text + "\n" + "\n".join(items)


def _msg(traj: Trajectory, k: int, tokens: int) -> Message:
    return {"role": "user", "content": sized_status(traj, k, tokens)}


def replace_builder(tokens: int) -> Any:
    def build(traj: Trajectory, k: int) -> Request:
        return Request([*append_only_messages(traj, k), _msg(traj, k, tokens)], traj.tools, dict(BASE_KWARGS))

    build.__doc__ = f"status_replace with a ~{tokens}-token status"
    return build


def append_builder(tokens: int) -> Any:
    def build(traj: Trajectory, k: int) -> Request:
        import copy

        from kvreuse.benchmarks.patterns.request import system_message

        msgs: list[Message] = [system_message(traj)]
        for j in traj.thread_turns(k):
            msgs += traj.turns[j].new
            msgs.append(_msg(traj, j, tokens))
            if j != k:
                msgs.append(traj.turns[j].assistant)
        return Request(copy.deepcopy(msgs), traj.tools, dict(BASE_KWARGS))

    build.__doc__ = f"status_append with a ~{tokens}-token status"
    return build


def cells(runs: list[dict], stack: str = "qwen3-append") -> list[dict]:
    """One cell per (workload, size): both modes' totals, the measured status size, dollars per price table."""
    from kvreuse.benchmarks.patterns.cost import PRICE_RULES, session_dollars
    from kvreuse.benchmarks.patterns.verdicts import Runs

    by = {(w, p): r for (w, s, p, replies, cache), r in Runs(runs).by.items()
          if s == stack and cache == "radix" and replies == "cached"}  # fmt: skip
    out = []
    for w in dict.fromkeys(w for w, _ in by):
        base = by.get((w, "append_only"))
        for n in SIZES:
            rep, app = by.get((w, f"status_replace_{n}")), by.get((w, f"status_append_{n}"))
            if rep is None or app is None or base is None:
                continue
            reqs = len(rep["requests"])
            size = (rep["totals"]["prompt_tokens"] - base["totals"]["prompt_tokens"]) / reqs
            money = {rule.provider: (session_dollars(rep["requests"], rule), session_dollars(app["requests"], rule))
                     for rule in PRICE_RULES}  # fmt: skip
            out.append({"workload": w, "requests": reqs, "nominal": n, "status_tokens": size,
                        "replace": rep["totals"]["prefilled_tokens"], "append": app["totals"]["prefilled_tokens"],
                        "replace_ctx": rep["totals"]["max_context"], "append_ctx": app["totals"]["max_context"],
                        "money": money})  # fmt: skip
    return out


def table(cs: list[dict]) -> list[str]:
    from kvreuse.benchmarks.patterns.cost import PRICE_RULES

    if not cs:
        return []
    provs = [r.provider for r in PRICE_RULES]
    lines = ["| session (requests) | status (tokens, measured) | prefilled replace / append | max context replace / "
             "append | " + " | ".join(f"{p} $ replace / append (cheaper)" for p in provs) + " |",
             "|---|---|---|---|" + "---|" * len(provs)]  # fmt: skip
    for c in cs:
        money = " | ".join(f"{c['money'][p][0]:.4f} / {c['money'][p][1]:.4f} "
                           f"({'replace' if c['money'][p][0] < c['money'][p][1] else 'append'})" for p in provs)  # fmt: skip
        lines.append(f"| {c['workload']} ({c['requests']}) | {c['status_tokens']:.0f} | {c['replace']:,} / {c['append']:,} | "
                     f"{c['replace_ctx']:,} / {c['append_ctx']:,} | {money} |")  # fmt: skip
    return lines


LONG = 30  # requests: "dozens of tool-calling turns" (003), where the rule says append
LARGE = 300  # nominal status tokens: "a large status (a full TODO list plus an environment snapshot)"


def rule_of_thumb(cs: list[dict]) -> tuple[str, float, float] | None:
    """The rule of thumb judged on the sweep (cheaper mode in Anthropic dollars), half by half: append for
    long sessions (>= LONG requests) with a small status, replace for short ones or a large status (>= LARGE
    tokens nominal).  Fixed thresholds, not the run's own shortest session.  The value is the smaller of the
    two halves' shares of cells predicted right: the replace half alone holds with the cache off (replace
    sends fewer tokens), so without a long session to test the append half there is no verdict (None)."""
    if not cs:
        return None
    halves: dict[str, list[bool]] = {"append": [], "replace": []}
    wrong = []
    for c in cs:
        predicted = "replace" if c["requests"] < LONG or c["nominal"] >= LARGE else "append"
        rep, app = next(iter(c["money"].values()))
        ok = predicted == ("replace" if rep < app else "append")
        halves[predicted].append(ok)
        if not ok:
            wrong.append(f"{c['workload']}({c['requests']})@{c['nominal']}")
    if not halves["append"] or not halves["replace"]:
        return None
    share = {k: sum(v) / len(v) for k, v in halves.items()}
    text = (f"append half (>= {LONG} requests, status < {LARGE} tokens): {sum(halves['append'])} of "
            f"{len(halves['append'])} cells right; replace half: {sum(halves['replace'])} of {len(halves['replace'])} "
            f"(Anthropic $); wrong in: {', '.join(wrong) or 'none'}; append prefills less in "
            f"{sum(c['append'] < c['replace'] for c in cs)} of {len(cs)} cells")  # fmt: skip
    return text, min(share.values()), 1.0
