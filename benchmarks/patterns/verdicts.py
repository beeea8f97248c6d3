"""Verdicts computed from measured numbers by rules the report states next to each verdict.

A claim about the prefix cache is judged by its **cache effect**: how much more the claim's worse arm
prefills than its better arm with the cache on, divided by the same ratio with the prefix cache off
(the same pair, same prompts, run on an engine with ``prefix_cache="off"``).  Prompt-size differences
cancel; only what the cache did remains.  With the cache off (or cached counts zeroed) every cache
effect is 1.0, so no cache claim can come out confirmed; swapping the two arms inverts the effect, so
the verdict flips.  No verdict word is written by hand: ``grade`` maps a measured number to it.

Claims themselves (which seed, which section, which pair) are data in ``claims.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

MAIN = "qwen3-append"
CONFIRM = 1.2  # cache effect (or ratio) at which a claim is confirmed
NOISE = 1.05  # effects within [1/NOISE, NOISE] are page granularity: no difference


class Verdict(NamedTuple):
    """One row of the verdict table."""

    claim: str
    source: str  # seed and section
    pattern: str  # the runs it reads, e.g. "coding: append_only vs timestamp_end"
    number: str
    verdict: str  # confirmed | partly | refuted | not measurable here
    rule: str  # how ``verdict`` follows from ``number``
    why: str
    cache: bool  # a claim about the prefix cache (judged with a cache-off contrast)


class Runs:
    """Look-up of token-exact runs by (workload, stack, pattern, replies, prefix cache), among the runs of the
    default sessions at the run's page size (Experiment 2-3's short session and 256-token pages are apart)."""

    def __init__(self, runs: list[dict]) -> None:
        from collections import Counter

        pages = Counter(r.get("page_size") for r in runs if r.get("variant") != "quick")
        self.page = pages.most_common(1)[0][0] if pages else None
        self.by = {
            (r["workload"], r.get("stack"), r["pattern"], r.get("replies", "cached"), r.get("prefix_cache", "radix")): r
            for r in runs
            if r.get("variant") != "quick" and r.get("page_size") == self.page
        }  # fmt: skip

    def get(
        self, workload: str, pattern: str, stack: str = MAIN, replies: str = "cached", cache: str = "radix"
    ) -> dict | None:
        return self.by.get((workload, stack, pattern, replies, cache))


def grade(effect: float, confirm: float = CONFIRM) -> str:
    """The verdict for a ratio in the claim's favour: >= confirm confirmed, >= NOISE partly, else refuted."""
    return "confirmed" if effect >= confirm else "partly" if effect >= NOISE else "refuted"


def rule_text(confirm: float = CONFIRM) -> str:
    return f"confirmed at a cache effect >= {confirm:.2f}x, partly at >= {NOISE:.2f}x, else refuted"


def _n(v: float, unit: str = "") -> str:
    return f"${v:.4f}" if unit == "$" else f"{v:,.0f}"


def ratio(b: float, g: float) -> float:
    """b / g for any unit (dollars are below 1): 1.0 when both are 0, infinite when only g is."""
    return b / g if g > 0 else (1.0 if b <= 0 else float("inf"))


Arm = tuple[str, str, str]  # (workload, pattern, stack): the runs one side of a claim reads


def key(run: dict) -> Arm:
    return run["workload"], run["pattern"], run.get("stack", MAIN)


# -- measures: one number per run -------------------------------------------------------------------


def prefilled(run: dict) -> float:
    return run["totals"]["prefilled_tokens"]


def sub_prefilled(run: dict) -> float:
    """Prefill of the sub-agent threads (thread > 0)."""
    return sum(x["prefilled_tokens"] for x in run["requests"] if x["thread"] > 0)


def sub_flops(run: dict) -> float:
    """Prefill FLOPs of the sub-agent threads on a reference model (attention over the cached prefix too)."""
    from kvreuse.benchmarks.patterns.cost import prefill_flops

    return prefill_flops([x for x in run["requests"] if x["thread"] > 0])


def first_prefilled(run: dict) -> float:
    """Prefill of the run's first request (a new session's, on a warm engine)."""
    return run["requests"][0]["prefilled_tokens"]


Measure = Callable[[dict], float]


@dataclass(frozen=True)
class Contrast:
    """Claim: ``bad`` costs more than ``good`` *because of the cache*; judged by the cache effect
    ``(bad/good with the cache on) / (bad/good with the cache off)`` of ``measure``."""

    claim: str
    source: str
    workload: str
    good: str
    bad: str
    why: str
    measure: Measure = prefilled
    unit: str = "prefilled"
    stack: str = MAIN
    confirm: float = CONFIRM

    def arms(self) -> tuple[Arm, Arm]:
        return (self.workload, self.good, self.stack), (self.workload, self.bad, self.stack)

    def __call__(self, R: Runs) -> Verdict | None:
        runs = [
            R.get(self.workload, p, self.stack, cache=c)
            for c in ("radix", "off")
            for p in (self.good, self.bad)
        ]
        if any(r is None for r in runs):
            return None
        g_on, b_on, g_off, b_off = (self.measure(r) for r in runs)  # type: ignore[arg-type]
        on, off = ratio(b_on, g_on), ratio(b_off, g_off)
        effect = ratio(on, off)
        verdict = grade(effect, self.confirm)
        why = self.why if verdict != "refuted" else (
            "no cache effect beyond page granularity" if effect > 1 / NOISE
            else f"the opposite: `{self.good}` costs more once prompt sizes are accounted for"
        )  # fmt: skip
        u = self.unit
        number = (f"cache on: `{self.bad}` {_n(b_on, u)} vs `{self.good}` {_n(g_on, u)} {u} ({on:.2f}x); "
                  f"cache off: {_n(b_off, u)} vs {_n(g_off, u)} ({off:.2f}x); cache effect **{effect:.2f}x**")  # fmt: skip
        return Verdict(self.claim, self.source, f"{self.workload}: {self.good} vs {self.bad}", number, verdict,
                       f"cache effect = on-ratio / off-ratio; {rule_text(self.confirm)}", why, True)  # fmt: skip


@dataclass(frozen=True)
class Same:
    """Claim: ``a`` costs the same as ``b`` (no cache penalty): confirmed when the cache effect is within
    [1/NOISE, NOISE] and the cache saves both arms >= 50% of their cache-off prefill; partly within
    [1/CONFIRM, CONFIRM]; else refuted.  Symmetric, so its runs field is written ``a ~ b``.  The cache-off
    arm is the cached-replies run (the prompts do not depend on how replies were cached)."""

    claim: str
    source: str
    workload: str
    a: str
    b: str
    why: str
    replies: str = "cached"
    stack: str = MAIN
    symmetric = True  # swapping a and b is the same claim
    claims_equal = True  # a claim of no difference: equal arms must pass it

    def arms(self) -> tuple[Arm, Arm]:
        return (self.workload, self.a, self.stack), (self.workload, self.b, self.stack)

    def __call__(self, R: Runs) -> Verdict | None:
        on = [R.get(self.workload, p, self.stack, self.replies) for p in (self.a, self.b)]
        off = [R.get(self.workload, p, self.stack, cache="off") for p in (self.a, self.b)]
        if any(r is None for r in on + off):
            return None
        a_on, b_on = (prefilled(r) for r in on)  # type: ignore[arg-type]
        a_off, b_off = (prefilled(r) for r in off)  # type: ignore[arg-type]
        effect = ratio(ratio(b_on, a_on), ratio(b_off, a_off))
        saved = min(1 - a_on / max(a_off, 1), 1 - b_on / max(b_off, 1))
        near = max(effect, 1 / effect) if effect > 0 else float("inf")
        verdict = ("confirmed" if near <= NOISE and saved >= 0.5 else
                   "partly" if near <= CONFIRM and saved >= 0.5 else "refuted")  # fmt: skip
        number = (f"replies {self.replies}: `{self.b}` {_n(b_on)} vs `{self.a}` {_n(a_on)} prefilled; cache off: "
                  f"{_n(b_off)} vs {_n(a_off)}; cache effect **{effect:.2f}x**; the cache saves both >= {saved:.0%}")  # fmt: skip
        rule = (f"confirmed when the cache effect is within {1 / NOISE:.2f}-{NOISE:.2f}x and the cache saves both "
                f"arms >= 50%; partly within {1 / CONFIRM:.2f}-{CONFIRM:.2f}x; else refuted")  # fmt: skip
        why = (
            self.why
            if verdict != "refuted"
            else f"`{self.b}` costs {effect:.2f}x once prompt sizes are accounted for"
        )
        return Verdict(
            self.claim, self.source, f"{self.workload}: {self.a} ~ {self.b}", number, verdict, rule, why, True
        )


@dataclass(frozen=True)
class Invalidates:
    """Claim: ``pattern`` loses (almost) all reuse.  Saved share = 1 - prefill(cache on) / prefill(cache off);
    confirmed when it is <= 5% while ``ref`` (append-only) saves >= 50% on the same workload."""

    claim: str
    source: str
    workload: str
    pattern: str
    why: str
    ref: str = "append_only"
    stack: str = MAIN

    def arms(self) -> tuple[Arm, Arm]:
        return (self.workload, self.ref, self.stack), (self.workload, self.pattern, self.stack)

    def __call__(self, R: Runs) -> Verdict | None:
        runs = [
            R.get(self.workload, p, self.stack, cache=c)
            for p in (self.pattern, self.ref)
            for c in ("radix", "off")
        ]
        if any(r is None for r in runs):
            return None
        p_on, p_off, r_on, r_off = (prefilled(r) for r in runs)  # type: ignore[arg-type]
        sp, sr = 1 - p_on / max(p_off, 1), 1 - r_on / max(r_off, 1)
        ok = sp <= 0.05 and sr >= 0.5
        verdict = "confirmed" if ok else "partly" if sp < sr / 2 else "refuted"
        number = (f"`{self.pattern}` saves {sp:.1%} of its cache-off prefill ({_n(p_on)} vs {_n(p_off)}); "
                  f"`{self.ref}` saves {sr:.1%} ({_n(r_on)} vs {_n(r_off)})")  # fmt: skip
        rule = (f"saved = 1 - prefill(cache on)/prefill(cache off); confirmed when `{self.pattern}` saves <= 5% and "
                f"`{self.ref}` >= 50%; partly when it saves under half of what `{self.ref}` saves; else refuted")  # fmt: skip
        return Verdict(self.claim, self.source, f"{self.workload}: {self.ref} vs {self.pattern}", number, verdict,
                       rule, self.why if verdict != "refuted" else "the cache still reuses much of it", True)  # fmt: skip


def extends(run: dict) -> tuple[int, int]:
    """(requests that reuse their thread's whole previous prompt in whole pages, requests with a previous one).

    A request extends its predecessor when it prefills at most its prompt minus the predecessor's prompt
    rounded down to pages: the bound is set by the prompt sizes alone, not by the run's own ideal (which
    any layout reaches: a prompt changed at its start has an ideal of everything)."""
    page, last, k, n = run.get("page_size") or 16, {}, 0, 0
    for x in run["requests"]:
        prev = last.get(x["thread"])
        if prev is not None:
            n += 1
            k += x["prefilled_tokens"] <= x["prompt_tokens"] - prev // page * page
        last[x["thread"]] = x["prompt_tokens"]
    return k, n


@dataclass(frozen=True)
class Reaches:
    """Claim: ``pattern`` reuses everything: every request after its thread's first prefills no more than
    what it adds to its predecessor's prompt (in whole pages); the cache-off run must miss that bound."""

    claim: str
    source: str
    workload: str
    why: str
    pattern: str = "append_only"
    stack: str = MAIN

    def arms(self) -> tuple[Arm]:
        return ((self.workload, self.pattern, self.stack),)

    def __call__(self, R: Runs) -> Verdict | None:
        on, off = (
            R.get(self.workload, self.pattern, self.stack),
            R.get(self.workload, self.pattern, self.stack, cache="off"),
        )
        if on is None or off is None:
            return None
        (k_on, n), (k_off, _) = extends(on), extends(off)
        verdict = ("confirmed" if k_on == n > k_off else
                   "partly" if k_on > k_off and k_on >= n / 2 else "refuted")  # fmt: skip
        t = on["totals"]
        number = (f"{k_on} of {n} requests prefill only what they add to their thread's previous prompt (whole pages); "
                  f"prefilled {_n(t['prefilled_tokens'])} of {_n(t['prompt_tokens'])} prompt tokens (ideal "
                  f"{_n(t['ideal_tokens'])}); cache off: {k_off} of {n}")  # fmt: skip
        rule = ("confirmed when every request is within the bound and the cache-off run is not; partly when at least "
                "half are and more than with the cache off; else refuted")  # fmt: skip
        return Verdict(self.claim, self.source, f"{self.workload}: {self.pattern}", number, verdict, rule,
                       self.why if verdict == "confirmed" else "requests recompute part of their predecessor", True)  # fmt: skip


@dataclass(frozen=True)
class Measured:
    """A claim checked by a function of the runs returning (number text, value, bound): confirmed when
    value >= bound, partly when value >= ``partly_at`` x bound, else refuted (``rule`` says what value
    and bound are).  ``sides`` names the runs it compares (the integrity test swaps and equalises them);
    its bounds are set so that a null effect (both sides equal) is refuted."""

    claim: str
    source: str
    pattern: str
    compute: Callable[[Runs], tuple[str, float, float] | None]
    rule: str
    why: str
    cache: bool = False
    partly_at: float = 0.5
    sides: tuple[Arm, ...] = ()
    symmetric: bool = False  # the claim reads the same with its sides swapped (e.g. two tokenizers)

    def arms(self) -> tuple[Arm, ...]:
        return self.sides

    def __call__(self, R: Runs) -> Verdict | None:
        got = self.compute(R)
        if got is None:
            return None
        number, value, bound = got
        verdict = (
            "confirmed" if value >= bound else "partly" if value >= self.partly_at * bound else "refuted"
        )
        rule = f"{self.rule}; confirmed at >= the bound, partly at >= {self.partly_at:g}x it, else refuted"
        return Verdict(self.claim, self.source, self.pattern, number, verdict, rule,
                       self.why if verdict != "refuted" else "the measured figure falls short of the claim", self.cache)  # fmt: skip


@dataclass(frozen=True)
class AllOf:
    """Claim that holds for several sub-verdicts at once: confirmed when all are confirmed, partly when
    some are confirmed or partly, refuted when none is."""

    claim: str
    source: str
    parts: tuple[Any, ...]
    why: str

    def arms(self) -> tuple[Arm, ...]:
        return tuple(dict.fromkeys(a for p in self.parts for a in p.arms()))

    def __call__(self, R: Runs) -> Verdict | None:
        vs = [p(R) for p in self.parts]
        if any(v is None for v in vs):
            return None
        words = [v.verdict for v in vs]  # type: ignore[union-attr]
        verdict = "confirmed" if all(w == "confirmed" for w in words) else (
            "refuted" if all(w == "refuted" for w in words) else "partly")  # fmt: skip
        number = "; ".join(f"{v.claim}: {v.verdict} ({v.number})" for v in vs)  # type: ignore[union-attr]
        # each part's own rule too (a part's rule is otherwise nowhere in the table)
        parts = " / ".join(dict.fromkeys(v.rule for v in vs))  # type: ignore[union-attr]
        return Verdict(self.claim, self.source, " + ".join(dict.fromkeys(v.pattern for v in vs)), number, verdict,  # type: ignore[union-attr]
                       "confirmed when every part is confirmed, refuted when none is confirmed or partly, else partly; "
                       f"each part: {parts}", self.why, any(v.cache for v in vs))  # type: ignore[union-attr]  # fmt: skip


@dataclass(frozen=True)
class NotMeasurable:
    """A checkable claim this benchmark cannot measure, with why and what would."""

    claim: str
    source: str
    why: str

    def arms(self) -> tuple[Arm, ...]:
        return ()

    def __call__(self, R: Runs) -> Verdict:
        return Verdict(self.claim, self.source, "-", "-", "not measurable here", "-", self.why, False)


def table(vs: list[Verdict]) -> list[str]:
    """The verdict table; a rule shared by several rows is written once, under the table, and the rows
    name it (R1, R2, ...); section names get their English gloss."""
    from collections import Counter

    from kvreuse.benchmarks.patterns.glosses import gloss

    shared = [r for r, n in Counter(v.rule for v in vs).items() if n > 1 and r != "-"]
    name = {r: f"R{k}" for k, r in enumerate(shared, 1)}
    lines = [
        "| # | claim | seed, section | runs | number | verdict | rule | why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {i} | {v.claim} | {gloss(v.source)} | `{v.pattern}` | {v.number} | **{v.verdict}** | "
              f"{name.get(v.rule, v.rule)} | {v.why} |" for i, v in enumerate(vs, 1)]  # fmt: skip
    if shared:
        lines += ["", "Rules shared by several rows:", ""] + [f"- **{name[r]}**: {r}" for r in shared]
    return lines


def number_rows(text: str, vs: list[Verdict]) -> str:
    """Resolve ``{row:PREFIX}`` references (claims and notes naming another row) to that row's number in
    the table, so a row merged or added cannot leave a note pointing at the wrong one; a claim not in
    this table is named instead."""
    import re

    def sub(m: re.Match) -> str:
        prefix = m.group(1)
        hit = next((i for i, v in enumerate(vs, 1) if v.claim.startswith(prefix)), None)
        return f"row {hit}" if hit is not None else f'the row "{prefix}..."'

    return re.sub(r"\{row:([^}]+)\}", sub, text)
