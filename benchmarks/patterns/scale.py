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

from kvreuse.benchmarks.patterns.verdicts import MAIN, Contrast, Invalidates, Runs, Same, Verdict

SCALE_STACKS = (MAIN, "llama3.1")
LONG = "agent"


def pair_claims() -> list[Any]:
    """The verdict table's pair claims (cache contrasts, invalidations, sameness), in table order."""
    from kvreuse.benchmarks.patterns.claims import CLAIMS

    return [c for c in CLAIMS if isinstance(c, (Contrast, Invalidates, Same))]


def scale_checks() -> list[tuple[Any, list[Any]]]:
    """(claim on its own workload, [the same claim on the agent session under each stack])."""
    return [(c, [replace(c, workload=LONG, stack=s) for s in SCALE_STACKS]) for c in pair_claims()]


def figure(v: Verdict | None) -> str:
    """The one number a row is judged on (cache effect, or the share the cache saves)."""
    if v is None:
        return "-"
    m = re.search(r"cache effect \*\*([\d.]+x)\*\*", v.number)
    saves = re.search(r"saves ([\d.]+%)", v.number)
    got = m.group(1) if m else f"the cache saves it {saves.group(1)}" if saves else ""
    return f"{got} {v.verdict}".strip()


def scale_table(runs: list[dict]) -> list[str]:
    R = Runs(runs)
    rows = []
    for c, longs in scale_checks():
        short, vs = c(R), [x(R) for x in longs]
        if short is None or all(v is None for v in vs):
            continue
        flip = "**yes**" if any(v is not None and v.verdict != short.verdict for v in vs) else "no"
        rows.append(f"| {c.claim} | `{short.pattern}` | {figure(short)} | " + " | ".join(figure(v) for v in vs)
                    + f" | {flip} |")  # fmt: skip
    if not rows:
        return []
    n = {w: len(r["requests"]) for w in (c.workload for c, _ in scale_checks()) for r in runs
         if r["workload"] == w and r["pattern"] == "append_only" and r.get("stack") == MAIN
         and r.get("variant") == "default"}  # fmt: skip
    head = " | ".join(f"{LONG} ({n.get(LONG, 65)} requests), {s}" for s in SCALE_STACKS)
    return ["", "## Verdicts at agent scale", "",
            f"The same rule on the same pair at two session lengths: the row's own session ({n.get('coding', 10)} "
            f"coding requests) beside the agent session ({n.get(LONG, 65)} requests, ~17K-token static prefix, 2 "
            "sub-agents) under both tokenizers, each against its own cache-off twin. A row the agent session has no "
            "pair for is left out.", "",
            f"| claim | runs (own session) | own session, {MAIN} | {head} | verdict changes with length |",
            "|---|---|---|" + "---|" * len(SCALE_STACKS) + "---|",
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
    for c, longs in scale_checks():
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
        lv = longs[0](R)
        at = (LONG, lv) if lv is not None and _cost(R, LONG, MAIN, good, bad, measure) else (c.workload, v)
        cost = _cost(R, at[0], MAIN, good, bad, measure)
        if cost is None:
            continue
        items.append((cost[1], c, good, bad, at, cost, v))
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
