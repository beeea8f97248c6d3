"""Every verdict of the table can fail against its own claim: the audit (``benchmarks/patterns/audit.py``)
re-scores the committed default results through each row's own rule with the cache off, the row's arms
swapped, its arms made equal (a null effect) and pattern names shuffled, and finds nothing wrong; and the
same audit catches a mutant that hard-codes any one row's verdict to any word.

On the third edition's code the audit finds rows 1 (any layout "reuses everything"), 32 and 34-38
(a null effect passes, a ratio floored at 1 on dollars, the run's own shortest session as "short",
ties counted as ordered); see the fourth edition's notes in docs/patterns.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvreuse.benchmarks.patterns.audit import COMPUTED, Hardcoded, Perturbed, problems
from kvreuse.benchmarks.patterns.claims import CLAIMS

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "patterns_default" / "results.json"


@pytest.fixture(scope="module")
def perturbed() -> Perturbed:
    return Perturbed(json.loads(RESULTS.read_text())["runs"])


def _computed(P: Perturbed) -> list:
    """Every row with a computed verdict: the table's, and its pair rows restated at agent scale."""
    from kvreuse.benchmarks.patterns.scale import scale_checks

    checks = [*CLAIMS, *(x for _, longs in scale_checks() for x in longs)]
    return [c for c in checks if (v := c(P.base)) is not None and v.verdict in COMPUTED]


def test_every_row_can_fail_and_does_where_it_must(perturbed: Perturbed) -> None:
    rows = _computed(perturbed)
    words = {c(perturbed.base).verdict for c in rows}
    assert len(rows) >= 35 and words == set(COMPUTED)  # the real results give every kind of verdict
    found = [p for c in rows for p in problems(c, perturbed)]
    assert found == [], "\n".join(found)


def test_the_audit_catches_a_hardcoded_verdict_in_any_row(perturbed: Perturbed) -> None:
    missed = [(c.claim[:50], w) for c in _computed(perturbed) for w in COMPUTED
              if not problems(Hardcoded(c, w), perturbed)]  # fmt: skip
    assert missed == []


def test_no_cache_claim_is_confirmed_without_a_cache(perturbed: Perturbed) -> None:
    confirmed = [
        c.claim
        for c in _computed(perturbed)
        if (v := c(perturbed.off)) and v.cache and v.verdict == "confirmed"
    ]
    assert confirmed == []


def test_a_derived_cache_off_run_equals_the_engines(perturbed: Perturbed) -> None:
    """The agent session's cache-off twins are derived from its cache-on runs (``sections.cache_off``);
    on every pair the engine ran both ways, the derivation gives the engine's cache-off counts exactly."""
    from kvreuse.benchmarks.patterns.sections import cache_off

    fields = ("prompt_tokens", "cached_tokens", "prefilled_tokens", "generated_tokens", "ideal_tokens")
    by = {(r["workload"], r["variant"], r["stack"], r["pattern"], r["replies"], r.get("prefix_cache"), r["page_size"]): r
          for r in perturbed.runs}  # fmt: skip
    pairs = [
        (r, by[k[:5] + ("radix",) + k[6:]])
        for k, r in by.items()
        if k[5] == "off" and k[:5] + ("radix",) + k[6:] in by
    ]
    assert len(pairs) >= 60
    for off, on in pairs:
        got = cache_off(on)
        assert [[x[f] for f in fields] for x in got["requests"]] == [
            [x[f] for f in fields] for x in off["requests"]
        ]
        assert got["totals"]["prefilled_tokens"] == off["totals"]["prefilled_tokens"]


def test_real_traffic_hook_reads_recordings_when_present(tmp_path: Path) -> None:
    from kvreuse.benchmarks.patterns.real_traffic import section

    assert section(tmp_path / "none") == []
    rows = [{"prompt_tokens": 100, "cached_tokens": 0, "ideal_cached": 0},
            {"prompt_tokens": 200, "cached_tokens": 96, "ideal_cached": 96},
            {"prompt_tokens": 300, "cached_tokens": 96, "ideal_cached": 192}]  # fmt: skip
    (tmp_path / "claude.json").write_text(json.dumps({"sessions": [{"agent": "claude-code", "rows": rows}]}))
    text = "\n".join(section(tmp_path))
    assert (
        "| claude-code | 3 | 2 of 3 | 96 (66.7% of the ideal reached) | 192 / 600 (32%) | refuted |" in text
    )


@pytest.mark.parametrize(
    "layout", ["timestamp_start", "tools_reordered", "status_in_system", "text_unstable"]
)
def test_row_1_refutes_a_layout_that_rewrites_its_prefix(perturbed: Perturbed, layout: str) -> None:
    """Row 1 ("append-only reuses everything") read from a layout that rewrites its prefix every turn must
    be refuted (the third edition's rule compared each run with its own ideal and confirmed all four)."""
    from kvreuse.benchmarks.patterns.audit import substituted
    from kvreuse.benchmarks.patterns.verdicts import Reaches, Runs

    row = next(c for c in CLAIMS if isinstance(c, Reaches))
    assert row(perturbed.base).verdict == "confirmed"
    side = row.arms()[0]
    v = row(Runs(substituted(perturbed.runs, side, (side[0], layout, side[2]))))
    assert v.verdict == "refuted", v.number


def test_every_pair_row_is_judged_at_agent_scale_or_says_why(perturbed: Perturbed) -> None:
    """Each pair row (a vs b) has a verdict on the 65-request agent session under both tokenizers, or (a part
    of) it names why its pattern cannot run there; on the third edition's results 20 of 27 had neither."""
    from kvreuse.benchmarks.patterns.scale import SCALE_STACKS, missing, scale_checks
    from kvreuse.benchmarks.patterns.verdicts import AllOf

    short = []
    for c, longs in scale_checks():
        assert c(perturbed.base) is not None, c.claim
        for x, s in zip(longs, SCALE_STACKS, strict=True):
            parts = zip(x.parts, c.parts, strict=True) if isinstance(x, AllOf) else [(x, c)]
            for p, q in parts:
                if p(perturbed.base) is None and not missing(q, s).startswith("n/a"):
                    short.append((c.claim[:50], s))
    assert short == []


def test_no_two_rows_measure_one_claim(perturbed: Perturbed) -> None:
    """Two cache rows reading the same two patterns of one session must be distinct claims: a claim of no difference
    on the prompt (replies replayed) beside a cost claim on the replies' KV (cached), not one claim twice (the
    sub-agent rows 19/32 and the text rows 13/14 of the third edition)."""
    from itertools import combinations

    from kvreuse.benchmarks.patterns.verdicts import Contrast, Same

    rows = [c for c in CLAIMS if (v := c(perturbed.base)) is not None and v.cache  # cache claims on one pair
            and len({(w, p) for w, p, _ in c.arms()}) == 2]  # fmt: skip
    for a, b in combinations(rows, 2):
        if {(w, p) for w, p, _ in a.arms()} != {(w, p) for w, p, _ in b.arms()}:
            continue
        kinds = {type(a), type(b)}
        assert kinds == {Same, Contrast}, (a.claim[:50], b.claim[:50])
        same = a if isinstance(a, Same) else b
        assert same.replies == "replayed", same.claim
