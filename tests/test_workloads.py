"""The committed workloads are deterministic, regenerable, and sized as the benchmark needs."""

from __future__ import annotations

import pytest

from kvreuse.benchmarks.workloads import DATA_DIR, DEFAULT_SEED, VARIANTS, WORKLOADS, data_path, load
from kvreuse.benchmarks.workloads.generate import build


@pytest.fixture(scope="module")
def tokenizer():
    import transformers

    from kvreuse.runtime.loading.model_source import resolve_model

    return transformers.AutoTokenizer.from_pretrained(resolve_model(None)[0])


@pytest.mark.parametrize("name", WORKLOADS)
def test_same_seed_same_json_and_different_seed_differs(name):
    a, b = build(name, "default", 123), build(name, "default", 123)
    assert a.to_json() == b.to_json()
    assert build(name, "default", 124).to_json() != a.to_json()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", WORKLOADS)
def test_stored_data_equals_regenerated(name, variant):
    stored = data_path(name, variant).read_text(encoding="utf-8")
    assert stored == build(name, variant, DEFAULT_SEED).to_json()
    assert load(name, variant).to_json() == stored


def test_data_stays_small():
    assert sum(p.stat().st_size for p in DATA_DIR.glob("*.json")) < 1_500_000


@pytest.mark.parametrize("name", WORKLOADS)
def test_static_prefix_is_2k_to_5k_tokens(name, tokenizer):
    from kvreuse.chat_templates import render

    traj = load(name)
    sys = [{"role": "system", "content": traj.system}]
    n = len(render(tokenizer, sys, traj.tools, template="qwen3", add_generation_prompt=False).token_ids)
    assert 2000 <= n <= 5000


@pytest.mark.parametrize("name", WORKLOADS)
def test_turn_counts(name):
    default, quick = load(name, "default"), load(name, "quick")
    assert 10 <= len(default.turns) <= 30
    assert 4 <= len(quick.turns) < len(default.turns)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", WORKLOADS)
def test_every_tool_call_gets_its_result_in_the_same_thread(name, variant):
    traj = load(name, variant)
    for k, turn in enumerate(traj.turns):
        calls = [c["id"] for c in turn.assistant.get("tool_calls") or []]
        later = traj.turns[k + 1 :]
        results = {
            m["tool_call_id"] for t in later if t.thread == turn.thread for m in t.new if m["role"] == "tool"
        }
        assert set(calls) <= results, f"turn {k}: calls without results"


def test_fanout_has_a_parent_and_three_sub_agents():
    traj = load("fanout")
    assert sorted({t.thread for t in traj.turns}) == [0, 1, 2, 3]
    for thread in (1, 2, 3):
        first = next(t for t in traj.turns if t.thread == thread)
        assert [m["role"] for m in first.new] == ["user"]
    parent_calls = traj.turns[0].assistant["tool_calls"]
    assert [c["function"]["name"] for c in parent_calls] == ["task"] * 3


@pytest.mark.parametrize("name", WORKLOADS)
def test_same_seed_same_tokens(name, tokenizer):
    """Two builds from one seed render to identical token streams, request by request."""
    from kvreuse.benchmarks.patterns import PATTERNS
    from kvreuse.chat_templates import render

    def streams(traj):
        reqs = PATTERNS["append_only"].requests(traj)
        return [
            render(tokenizer, r.messages, r.tools, template="qwen3", **r.template_kwargs).token_ids
            for r in reqs
        ]

    a, b = build(name, "quick", 7), build(name, "quick", 7)
    assert a is not b and streams(a) == streams(b)
    assert streams(build(name, "quick", 8)) != streams(a)
