"""Each cache claim at two session lengths, and the reader's summary drawn from them.

``scale_checks`` re-states every pair claim of the verdict table on the agent session (65 requests, ~17K
static prefix) under both tokenizers: the same rule, the same pair, another workload.  ``summary`` ranks
the pairs by what the worse layout costs per agent session (prefilled tokens and Anthropic dollars), so
the report can open with "do this / avoid that, and what it costs".
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from kvreuse.benchmarks.patterns.verdicts import (
    MAIN,
    AllOf,
    Contrast,
    Invalidates,
    Measured,
    Runs,
    Same,
    Verdict,
)

SCALE_STACKS = (MAIN, "llama3.1")
LONG = "agent"


def _pairs(c: Any) -> list[Any]:
    """The pair claims a row is made of: itself, or an ``AllOf``'s pair parts."""
    if isinstance(c, (Contrast, Invalidates, Same)):
        return [c]
    if not isinstance(c, AllOf):
        return []
    return [p for p in c.parts if isinstance(p, (Contrast, Invalidates, Same))]


def pair_claims() -> list[Any]:
    """The verdict table's pair rows (cache contrasts, invalidations, sameness, and rows whose parts are
    pairs), in table order."""
    from kvreuse.benchmarks.patterns.claims import CLAIMS

    return [c for c in CLAIMS if _pairs(c)]


def at(c: Any, workload: str, stack: str) -> Any:
    """The same claim, the same rule, on another session and stack."""
    if isinstance(c, AllOf):
        return replace(c, parts=tuple(at(p, workload, stack) for p in c.parts))
    if isinstance(c, Measured):  # a compute that names its session (claims_measured.SubFlops)
        return replace(c, compute=replace(c.compute, workload=workload, stack=stack),
                       pattern=f"{workload}: {c.pattern.split(': ', 1)[-1]}",
                       sides=tuple((workload, p, stack) for _, p, _ in c.sides))  # fmt: skip
    return replace(c, workload=workload, stack=stack)


def scale_checks() -> list[tuple[Any, list[Any]]]:
    """(claim on its own workload, [the same claim on the agent session under each stack])."""
    return [(c, [at(c, LONG, s) for s in SCALE_STACKS]) for c in pair_claims()]


def patterns_of(c: Any) -> list[str]:
    return list(dict.fromkeys(p for _, p, _ in c.arms()))


def missing(c: Any, stack: str) -> str:
    """Why a row has no agent-scale verdict under ``stack``."""
    from kvreuse.benchmarks.patterns.plan import NOT_ON_LLAMA

    why = [NOT_ON_LLAMA[p] for p in patterns_of(c) if stack == "llama3.1" and p in NOT_ON_LLAMA]
    return f"n/a: {why[0]}" if why else "not run"


def partial(c: Any, restated: Any, stack: str, R: Runs) -> str:
    """A row with no verdict under ``stack``: why, and for a row of several parts the parts that have one."""
    if not isinstance(restated, AllOf):
        return missing(c, stack)
    parts = [(p.claim, p(R), q) for p, q in zip(restated.parts, c.parts, strict=True)]
    return "; ".join(
        f"{name}: {figure(v)}" if v is not None else f"{name}: {missing(q, stack)}" for name, v, q in parts
    )


def figure(v: Verdict | None) -> str:
    """The number(s) a row is judged on (cache effect, or the share the cache saves) and its verdict."""
    if v is None:
        return "-"
    got = re.findall(r"\*\*([\d.]+x)\*\*", v.number)
    saves = re.findall(r"saves ([\d.]+%)", v.number)
    text = " / ".join(got) if got else f"the cache saves it {saves[0]}" if saves else ""
    return f"{text} {v.verdict}".strip()


def scale_table(runs: list[dict]) -> list[str]:
    """Every pair row at its own session's length beside the agent session under both tokenizers; a row
    the agent session cannot take under a stack says why."""
    from kvreuse.benchmarks.patterns.claims import verdicts

    R = Runs(runs)
    numbers = {v.claim: i for i, v in enumerate(verdicts(runs), 1)}
    rows = []
    for c, longs in scale_checks():
        short, vs = c(R), [x(R) for x in longs]
        if short is None:
            continue
        cells = [
            figure(v) if v is not None else partial(c, x, s, R)
            for v, x, s in zip(vs, longs, SCALE_STACKS, strict=True)
        ]
        flip = "**yes**" if any(v is not None and v.verdict != short.verdict for v in vs) else "no"
        rows.append(f"| {numbers.get(c.claim, '-')} | {c.claim} | `{short.pattern}` | {figure(short)} | "
                    + " | ".join(cells) + f" | {flip} |")  # fmt: skip
    if not rows:
        return []
    n = {w: len(r["requests"]) for w in ("coding", LONG) for r in runs
         if r["workload"] == w and r["pattern"] == "append_only" and r.get("stack") == MAIN
         and r.get("variant") == "default"}  # fmt: skip
    head = " | ".join(f"{LONG} ({n.get(LONG, 65)} requests), {s}" for s in SCALE_STACKS)
    return ["", "## Verdicts at agent scale", "",
            f"Every pair row at two session lengths, the same rule on the same pair: the row's own session (10-16 "
            f"requests: coding {n.get('coding', 10)}, research 12, fanout 16 of which 12 are sub-agents', 3 "
            f"coding sessions for the static-zone row) beside the agent session ({n.get(LONG, 65)} requests, ~17K-token "
            "static prefix, 2 sub-agents) under both tokenizers, each against its own cache-off twin. The agent "
            "session's counts come from the engine's reuse rule (tokens only: `AccountingTarget`, equal to the "
            "engine on every request where both ran); every row here is judged on tokens, or FLOPs computed from "
            "them, none on time. Events (a tool server connecting, a skill loaded, the date changing) fall at a "
            "third and two thirds of the main thread in both sessions.", "",
            f"| # | claim | runs (own session) | own session, {MAIN} | {head} | verdict changes with length |",
            "|---|---|---|---|" + "---|" * len(SCALE_STACKS) + "---|",
            *rows]  # fmt: skip


def _cost(
    R: Runs, workload: str, stack: str, good: str, bad: str, measure: Any
) -> tuple[float, float, int] | None:
    from kvreuse.benchmarks.patterns.claims_measured import _dollars

    g, b = R.get(workload, good, stack), R.get(workload, bad, stack)
    if g is None or b is None:
        return None
    d = _dollars("Anthropic")
    return measure(b) - measure(g), d(b) - d(g), len(g["requests"])


def summary(runs: list[dict]) -> list[str]:
    """Ranked "do / avoid, and what it costs": every pair claim the runs confirm (or partly), by the extra
    Anthropic dollars of the worse layout per session at the longest scale measured."""
    from kvreuse.benchmarks.patterns import PATTERNS

    R = Runs(runs)
    items = []
    for c in (p for row in pair_claims() for p in _pairs(row)):  # an AllOf row: each of its pairs
        v = c(R)
        if v is None:
            continue
        good, bad = (
            (c.ref, c.pattern)
            if isinstance(c, Invalidates)
            else (c.a, c.b)
            if isinstance(c, Same)
            else (c.good, c.bad)
        )
        measure = lambda r: r["totals"]["prefilled_tokens"]  # noqa: E731 - the whole session, as the dollars
        lv = at(c, LONG, MAIN)(R)
        where = (LONG, lv) if lv is not None and _cost(R, LONG, MAIN, good, bad, measure) else (c.workload, v)
        cost = _cost(R, where[0], MAIN, good, bad, measure)
        if cost is None:
            continue
        items.append((cost[1], c, good, bad, where, cost, v))
    if not items:
        return []
    items.sort(key=lambda x: -x[0])
    desc = lambda p: (PATTERNS[p].claim if p in PATTERNS else p).removesuffix(": should reach the ideal")  # noqa: E731
    do = [x for x in items if x[4][1].verdict in ("confirmed", "partly") and not isinstance(x[1], Same)]
    rest = [x for x in items if x not in do]
    lines = ["## Do / avoid, and what it costs", "",
             "Every layout pair the measurements support, ranked by what the worse layout adds to one session in "
             f"dollars (Anthropic prices: cache reads 0.1x, writes 1.25x), on the longest session measured (the agent "
             f"session, {MAIN}, where it has the pair). Verdicts and rules are in the table below.", "",
             "| # | do | avoid | extra prefill per session | extra $ per session | session | verdict there |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for k, (_, _c, good, bad, (w, lv), (dp, dd, n), _v) in enumerate(do, 1):
        other = " (in dollars the other way round: cheap cache reads of what it keeps)" if dd < 0 else ""
        lines.append(f"| {k} | `{good}`: {desc(good)} | `{bad}`: {desc(bad)} | {dp:+,.0f} | {dd:+.4f}{other} | {w} ({n} requests) | "
                     f"{figure(lv)} |")  # fmt: skip
    same = [x for x in rest if isinstance(x[1], Same)]
    weak = [x for x in rest if x not in same]
    if weak:
        lines += ["", "No measurable difference (refuted: not worth a change on this evidence): " + "; ".join(
            f"`{x[3]}` vs `{x[2]}` ({figure(x[4][1])} on {x[4][0]})" for x in weak) + "."]  # fmt: skip
    if same:
        lines += ["", "Claims of no difference: " + "; ".join(f"{x[1].claim} ({figure(x[4][1])} on {x[4][0]})"
                                                             for x in same) + "."]  # fmt: skip
    return lines


def without_row() -> list[str]:
    """The seed claims with no row, each with why and what would measure it."""
    from kvreuse.benchmarks.patterns.claims_coverage import WITHOUT_ROW
    from kvreuse.benchmarks.patterns.glosses import gloss

    return ["", "Seed claims without a row of their own, and why:", "",
            "| claim | seed, section | why no row | what would measure it |", "|---|---|---|---|",
            *(f"| {c} | {gloss(s)} | {why} | {what} |" for c, s, why, what in WITHOUT_ROW)]  # fmt: skip
