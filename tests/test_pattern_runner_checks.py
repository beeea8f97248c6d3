"""The report's checks on the quick coding workload (paged-cache fake engine, no model): each claim
passes on honest accounting, fails when the numbers contradict it, and fails against a run whose
prefix cache is off (the lower bounds); the verdict table covers every claim; the plan behaves."""

from __future__ import annotations

import copy

import pytest

from kvreuse.benchmarks.patterns.checks import CHECKED, acceptance
from kvreuse.benchmarks.patterns.pattern_runner import add_savings, make_plan, parse_args
from kvreuse.benchmarks.patterns.projection import CostModel, expected_prefill
from kvreuse.benchmarks.workloads import load
from tests.test_patterns import FakeEngine, run_all


@pytest.fixture(scope="module")
def runs():
    import transformers

    from kvreuse.runtime.loading.model_source import resolve_model

    tok = transformers.AutoTokenizer.from_pretrained(resolve_model(None)[0])
    return run_all(FakeEngine(tok), [*CHECKED, "naive"], load("coding", "quick"))


def by_pattern(runs):
    return {c["pattern"]: c for c in acceptance(list(runs.values()), 16) if c["check"] != "prefix_reused"}


def test_every_claim_passes_on_paged_prefix_cache_accounting(runs):
    checks = by_pattern(runs)
    assert set(checks) == set(CHECKED)
    every = acceptance(list(runs.values()), 16)
    assert all(c["ok"] for c in every), [c for c in every if not c["ok"]]
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


def test_every_check_fails_against_a_cache_off_run():
    """The same patterns sent to a target whose cache is off: every check must FAIL (reuse was required)."""
    import transformers

    from kvreuse.runtime.loading.model_source import resolve_model

    tok = transformers.AutoTokenizer.from_pretrained(resolve_model(None)[0])
    off = run_all(FakeEngine(tok, cache=False), [*CHECKED, "status_append"], load("coding", "quick"))
    checks = acceptance(list(off.values()), 16)
    assert {c["pattern"] for c in checks} == {*CHECKED, "status_append"}
    assert checks and not any(c["ok"] for c in checks), [c for c in checks if c["ok"]]


def test_plan_default_covers_the_claims_and_the_agent_session_quick_is_small():
    from kvreuse.benchmarks.patterns.sections import accounted

    default_tokens, default_timed = make_plan(parse_args([]))
    full_tokens, _ = make_plan(parse_args(["--full"]))
    quick_tokens, quick_timed = make_plan(parse_args(["--quick"]))
    assert {j.workload for j in default_tokens} == {"coding", "research", "fanout", "agent"}
    assert full_tokens == default_tokens  # --full only moves the agent session onto the engine
    assert accounted(parse_args([])) == {"agent"} and accounted(parse_args(["--full"])) == set()
    agent = {(j.stack, j.pattern, j.prefix_cache) for j in default_tokens if j.workload == "agent"}
    assert {(s, p, c) for s, p, _ in agent for c in ("radix", "off")} == agent  # cache-off twins, both stacks
    assert {s for s, _, _ in agent} == {"qwen3-append", "llama3.1"}
    assert {j.stack for j in default_tokens} == {"qwen3-stock", "qwen3-append", "llama3.1"}
    assert {j.replies for j in default_tokens} == {"cached", "replayed"}
    assert {j.pattern for j in default_timed} >= {"append_only", "naive", "timestamp_start"}
    assert len(quick_tokens) < len(default_tokens) and len(quick_timed) < len(default_timed)
    only, _ = make_plan(parse_args(["--patterns", "naive", "--no-ttft"]))
    assert only and {j.pattern for j in only} == {"naive"}
    with pytest.raises(ValueError):
        make_plan(parse_args(["--workloads", "nope"]))


def test_hybrid_rows_pass_only_at_the_predicted_snapshot(runs):
    """A hybrid's KV match is bounded like a dense model's, but its cached part must be exactly what the
    snapshot policy predicts: cutting a request back to a predicted snapshot passes, to any other
    point fails, and so does a KV match that stops short."""
    hyb = copy.deepcopy(runs["timestamp_end"])
    for r in hyb["requests"]:
        r["snapshot_expected"], r["snapshot_cut_expected"], r["snapshot_cut"] = r["cached_tokens"], 0, 0
    row = hyb["requests"][2]
    row["snapshot_cut"] = row["snapshot_cut_expected"] = row["cached_tokens"] - 32
    row["cached_tokens"] = row["snapshot_expected"] = 32
    row["prefilled_tokens"] += row["snapshot_cut"]

    def check(run):
        return {c["check"]: c for c in acceptance([run], 16)}

    ok = check(hyb)
    assert ok["timestamp_end"]["ok"] and ok["prefix_reused"]["ok"], ok
    assert "cut back to the last state snapshot" in ok["timestamp_end"]["text"]
    off = copy.deepcopy(hyb)
    off["requests"][2]["snapshot_expected"] = 48  # the policy had a snapshot later than where it resumed
    assert not any(c["ok"] for c in check(off).values())
    short = copy.deepcopy(hyb)
    short["requests"][2]["snapshot_cut"] = short["requests"][2]["snapshot_cut_expected"] = 0
    assert not check(short)["timestamp_end"]["ok"]
