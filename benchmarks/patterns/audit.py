"""The verdict table's audit: re-score the runs through each claim's own rule after perturbing them, and
list what a rule that can fail must not do.

Perturbations (each a new list of runs; the rules only read them):

* **cache off**: every cached count set to 0 (each request prefills its whole prompt): no cache claim
  may come out anything but refuted;
* **arms swapped**: the runs of a claim's two sides exchange labels (pattern and stack): a confirmed or
  partly verdict must turn refuted, unless the claim is symmetric by design (``symmetric``);
* **arms equal** (a null effect): every side's runs replaced by a copy of the first side's: a claim of
  a difference must be refuted (a claim of no difference, ``claims_equal``, must not be);
* **names shuffled**: pattern names permuted among a workload's runs (three fixed seeds; a row with no sides,
  which reads many runs, gets more seeds until its verdict moves, up to 39);
* **substituted** (rows with one side): the side's runs replaced by each other pattern's of its workload;
  a row of two sides that none of the above moves off "refuted" (no effect at this length) gets its worse
  side replaced the same way, until one gives another verdict.

Over all of them a row's verdict must take at least two values, so a rule that returns a fixed word
(``Hardcoded``, the mutant ``tests/test_verdict_integrity.py`` checks the audit against) cannot pass.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from kvreuse.benchmarks.patterns.verdicts import Arm, Runs, Verdict, key

COMPUTED = ("confirmed", "partly", "refuted")


def zeroed(runs: list[dict]) -> list[dict]:
    """Every cached count set to 0: each request prefills its whole prompt, as with the cache off."""
    out = []
    for r in runs:
        reqs = [{**x, "cached_tokens": 0, "prefilled_tokens": x["prompt_tokens"]} for x in r["requests"]]
        t = {**r["totals"], "cached_tokens": 0, "prefilled_tokens": r["totals"]["prompt_tokens"]}
        out.append({**r, "requests": reqs, "totals": t})
    return out


def _relabel(r: dict, arm: Arm) -> dict:
    return {**r, "workload": arm[0], "pattern": arm[1], "stack": arm[2]}


def swapped(runs: list[dict], a: Arm, b: Arm) -> list[dict]:
    """The runs of sides a and b exchange labels (every cache setting and reply mode)."""
    return [_relabel(r, b) if key(r) == a else _relabel(r, a) if key(r) == b else r for r in runs]


def equalised(runs: list[dict], arms: tuple[Arm, ...]) -> list[dict]:
    """Every side after the first replaced by a copy of the first side's runs: a null effect."""
    rest = set(arms[1:])
    out = [r for r in runs if key(r) not in rest]
    out += [_relabel(r, arm) for r in runs if key(r) == arms[0] for arm in arms[1:]]
    return out


def substituted(runs: list[dict], side: Arm, other: Arm) -> list[dict]:
    """The side's runs replaced by another pattern's, relabelled as the side."""
    return [r for r in runs if key(r) != side] + [_relabel(r, side) for r in runs if key(r) == other]


def shuffled(runs: list[dict], seed: int) -> list[dict]:
    """Pattern names permuted among each workload's runs (one permutation per workload, applied to every
    stack, cache setting and reply mode alike)."""
    rng, out = random.Random(seed), []
    perm: dict[str, dict[str, str]] = {}
    for w in dict.fromkeys(r["workload"] for r in runs):
        names = sorted({r["pattern"] for r in runs if r["workload"] == w})
        perm[w] = dict(zip(names, rng.sample(names, len(names))))
    for r in runs:
        out.append({**r, "pattern": perm[r["workload"]][r["pattern"]]})
    return out


class Perturbed:
    """The shared perturbations of one list of runs, looked up once (per-claim ones are made on demand)."""

    def __init__(self, runs: list[dict], seeds: tuple[int, ...] = (1, 2, 3)) -> None:
        self.runs = runs
        self.base = Runs(runs)
        self.off = Runs(zeroed(runs))
        self.shuffles = [Runs(shuffled(runs, s)) for s in seeds]


def problems(check: Any, P: Perturbed) -> list[str]:
    """What is wrong with one claim's rule on these runs (empty: it can fail and does so where it must)."""
    v0 = check(P.base)
    if v0 is None or v0.verdict not in COMPUTED:
        return []
    name, seen, out = v0.claim[:60], {v0.verdict}, []

    def score(R: Runs) -> Verdict | None:
        v = check(R)
        if v is not None:
            seen.add(v.verdict)
        return v

    off = score(P.off)
    if v0.cache and off is not None and off.verdict != "refuted":
        out.append(f"{name}: {off.verdict} with the cache off")
    arms = tuple(check.arms())
    symmetric = getattr(check, "symmetric", False)
    if len(arms) >= 2:
        a, b = arms[1 if len(arms) > 2 else 0], arms[-1]
        sw = score(Runs(swapped(P.runs, a, b)))
        if not symmetric and v0.verdict != "refuted" and sw is not None and sw.verdict != "refuted":
            out.append(f"{name}: {v0.verdict}, and {sw.verdict} with {a[1]}/{a[2]} and {b[1]}/{b[2]} swapped")
        eq = score(Runs(equalised(P.runs, arms)))
        if eq is not None and (eq.verdict == "refuted") == getattr(check, "claims_equal", False):
            out.append(f"{name}: {eq.verdict} with both sides equal (a null effect)")
    for R in P.shuffles:
        score(R)
    if len(arms) == 1:  # one side: it must tell its pattern from the workload's others
        w, pat, stack = arms[0]
        for other in sorted({r["pattern"] for r in P.runs if r["workload"] == w and r["pattern"] != pat}):
            score(Runs(substituted(P.runs, arms[0], (w, other, stack))))
    if len(seen) < 2 and len(arms) >= 2:  # a row refuted throughout (no effect either way): its worse side
        # replaced by each other pattern of its session until one makes a difference the rule sees
        w, _, stack = arms[-1]
        for other in sorted({r["pattern"] for r in P.runs if r["workload"] == w} - {a[1] for a in arms}):
            score(Runs(substituted(P.runs, arms[-1], (w, other, stack))))
            if len(seen) >= 2:
                break
    for seed in range(len(P.shuffles) + 1, 40):  # a row with no sides (it reads many runs): more shuffles
        if len(seen) >= 2 or arms:
            break
        score(Runs(shuffled(P.runs, seed)))
    if len(seen) < 2:
        out.append(f"{name}: always {v0.verdict} (cache off, swapped, equal sides, shuffled names)")
    return out


@dataclass(frozen=True)
class Hardcoded:
    """A mutant: the wrapped rule with its verdict word fixed (what the audit must catch)."""

    check: Any
    word: str

    def arms(self) -> tuple[Arm, ...]:
        return tuple(self.check.arms())

    @property
    def symmetric(self) -> bool:
        return getattr(self.check, "symmetric", False)

    @property
    def claims_equal(self) -> bool:
        return getattr(self.check, "claims_equal", False)

    def __call__(self, R: Runs) -> Verdict | None:
        v = self.check(R)
        return None if v is None else v._replace(verdict=self.word)
