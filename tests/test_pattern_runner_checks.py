"""The report's acceptance checks on the quick coding workload (paged-cache fake engine, no model):
each claim passes on honest accounting and fails when the numbers contradict it; the runner's plan
and projection behave."""

from __future__ import annotations

import copy

import pytest

from benchmarks.pattern_runner import add_savings, make_plan, parse_args
from benchmarks.patterns.checks import CHECKED, acceptance
from benchmarks.patterns.projection import CostModel, expected_prefill
from benchmarks.workloads import load
from tests.test_patterns import FakeEngine, run_all


@pytest.fixture(scope="module")
def runs():
    import transformers

    from runtime.model_source import resolve_model

    tok = transformers.AutoTokenizer.from_pretrained(resolve_model(None)[0])
    return run_all(FakeEngine(tok), [*CHECKED, "naive"], load("coding", "quick"))


def by_pattern(runs):
    return {c["pattern"]: c for c in acceptance(list(runs.values()), 16)}


def test_every_claim_passes_on_paged_prefix_cache_accounting(runs):
    checks = by_pattern(runs)
    assert set(checks) == set(CHECKED)
    assert all(c["ok"] for c in checks.values()), [c for c in checks.values() if not c["ok"]]
    starts = [r["change_start"] for r in runs["timestamp_start"]["requests"][1:]]
    ends = [r["change_start"] for r in runs["timestamp_end"]["requests"][1:]]
    assert max(starts) < 16 < min(ends)  # at the start: right after the header; at the end: after the prompt


def test_checks_fail_when_the_numbers_contradict_the_claim(runs):
    bad = copy.deepcopy(runs)
    bad["append_only"]["totals"]["prefilled_tokens"] = bad["append_only"]["totals"]["ideal_paged_tokens"] + 1
    bad["timestamp_start"]["requests"][2]["cached_tokens"] = 64
    bad["timestamp_end"]["requests"][2]["cached_tokens"] = 0
    slide = next(r for r in bad["sliding_window"]["requests"] if r["change_start"] is not None)
    slide["divergence"] = slide["prev_tokens"]  # a slide that kept the whole previous prompt
    moved = next(r for r in bad["tools_reordered"]["requests"] if r["change_start"] is not None)
    moved["cached_tokens"] = 0
    checks = by_pattern(bad)
    assert not any(checks[n]["ok"] for n in CHECKED), checks


def test_naive_savings_are_derived_where_naive_did_not_run(runs):
    only = copy.deepcopy([runs["append_only"], runs["sliding_window"]])
    add_savings(only)
    t = only[1]["totals"]
    assert t["savings_basis"] == "derived" and t["ttft_savings_vs_naive"] is None
    assert t["savings_vs_naive"] == pytest.approx(
        1 - t["prefilled_tokens"] / only[0]["totals"]["prompt_tokens"]
    )


def test_expected_prefill_counts_whole_shared_pages():
    assert expected_prefill([[1] * 40, [1] * 40 + [2] * 5], True, 16) == [40, 13]
    assert expected_prefill([[1] * 40, [1] * 45], False, 16) == [40, 45]


def test_cost_model_recovers_a_linear_cost():
    m = CostModel()
    for tokens in (10, 200, 2000, 50):
        m.add(tokens, 0.002 * tokens + 0.1)
    a, b = m.coefficients()
    assert a == pytest.approx(0.002) and b == pytest.approx(0.1)
    assert m.seconds_for([1000, 0]) == pytest.approx(2.2)


def test_full_plan_runs_every_pattern_default_keeps_the_acceptance_ones_and_quick_is_coding_only():
    from benchmarks.patterns import PATTERNS

    full = make_plan(parse_args(["--full"]))
    assert {p.name for _, ps in full for p in ps} == set(PATTERNS)
    assert sum(p.name == "naive" for _, ps in full for p in ps) == 1
    default = make_plan(parse_args([]))
    ran = {(t.name, p.name) for t, ps in default for p in ps}
    acceptance = {
        "append_only",
        "naive",
        "timestamp_start",
        "timestamp_end",
        "tools_reordered",
        "sliding_window",
    }
    assert {("coding", n) for n in acceptance} <= ran
    assert ("fanout", "append_only") in ran
    quick = make_plan(parse_args(["--quick"]))
    assert [t.name for t, _ in quick] == ["coding"] and quick[0][0].variant == "quick"
