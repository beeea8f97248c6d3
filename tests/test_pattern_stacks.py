"""Cached replies and the second edition's patterns, on the embedded tokenizer (no download, no model)."""

from __future__ import annotations

import pytest

from kvreuse.benchmarks.patterns import PATTERNS
from kvreuse.benchmarks.patterns.events import event_turns, tools_first
from kvreuse.benchmarks.patterns.stacks import STACKS, render_request, reply_tokens, template_source
from kvreuse.benchmarks.workloads import load


@pytest.fixture(scope="module")
def tokenizer():
    import transformers

    from kvreuse.runtime.loading.model_source import resolve_model

    return transformers.AutoTokenizer.from_pretrained(resolve_model(None)[0])


def test_forced_reply_is_what_the_next_append_only_request_renders(tokenizer):
    """Under an append-only template, prompt_k + reply_k is a prefix of prompt_{k+1} (an independent
    rendering: the next turn's full conversation), and the reply ends with the end-of-turn token."""
    traj, stack = load("coding", "quick"), STACKS["smollm2"]
    source = template_source(stack, tokenizer)
    reqs = PATTERNS["append_only"].requests(traj)
    rendered = [render_request(tokenizer, source, stack, r) for r in reqs]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for k in range(len(reqs) - 1):
        reply = reply_tokens(tokenizer, source, stack, reqs[k], rendered[k], traj.turns[k].assistant)
        assert reply and reply[-1] == end and end not in reply[:-1]
        nxt = rendered[k + 1].token_ids
        assert nxt[: len(rendered[k].token_ids) + len(reply)] == rendered[k].token_ids + reply


def test_stock_template_rewrites_the_reply_after_a_new_user_query(tokenizer):
    """Qwen3's stock template: the reply generated with its think block is re-rendered without it once a
    later user query exists, so the next request is not prompt + reply (the miss production sees)."""
    traj, stack = load("coding", "default"), STACKS["qwen3-stock"]
    source = template_source(stack, tokenizer)
    reqs = PATTERNS["append_only"].requests(traj)
    k = next(i for i in range(1, len(reqs)) if any(m["role"] == "user" for m in traj.turns[i].new)) - 1
    a, b = (render_request(tokenizer, source, stack, reqs[i]) for i in (k, k + 1))
    reply = reply_tokens(tokenizer, source, stack, reqs[k], a, traj.turns[k].assistant)
    assert "<think>" in tokenizer.decode(reply)
    assert b.token_ids[: len(a.token_ids) + len(reply)] != a.token_ids + reply


def test_tools_first_template_moves_the_system_text_after_the_tools(tokenizer):
    from kvreuse.chat_templates import load_template, render

    traj = load("coding", "quick")
    msgs = [{"role": "system", "content": "SYSTEM-TEXT"}, {"role": "user", "content": "hi"}]
    text = render(tokenizer, msgs, traj.tools, template=tools_first(load_template("qwen3", tokenizer))).text
    assert text.index("</tools>") < text.index("SYSTEM-TEXT") < text.index("<|im_start|>user")
    with pytest.raises(ValueError):
        tools_first("{{ messages }}")


@pytest.mark.parametrize(
    "good,bad",
    [("tools_toggle_message", "tools_toggled"), ("skill_in_messages", "skill_in_system"),
     ("date_in_messages", "date_in_system"), ("tools_dynamic_after", "tools_dynamic_sorted_in")],
)  # fmt: skip
def test_event_pairs_do_the_same_thing_and_only_the_bad_one_rewrites_the_prefix(good, bad, tokenizer):
    from kvreuse.chat_templates import first_divergence

    traj, stack = load("coding", "default"), STACKS["smollm2"]
    source = template_source(stack, tokenizer)
    a, b = event_turns(traj)
    for name, breaks in ((good, False), (bad, True)):
        reqs = PATTERNS[name].requests(traj)
        ids = [render_request(tokenizer, source, stack, r).token_ids for r in reqs]
        broken = [k for k in range(1, len(ids)) if first_divergence(ids[k - 1], ids[k]) < len(ids[k - 1])]
        if name == "tools_dynamic_after":  # both tool layouts change at the connect request
            assert broken == [a]
        else:
            assert bool(broken) == breaks, (name, broken)
            assert set(broken) <= {a, b}


def test_compaction_and_window_variants():
    traj = load("research", "default")
    reqs = PATTERNS["compact_threshold"].requests(traj)
    summaries = [k for k, r in enumerate(reqs) if r.messages[1]["content"].startswith("[summary")]
    assert summaries and summaries == list(range(summaries[0], len(reqs)))  # kept once made
    block = PATTERNS["sliding_window_block"].requests(load("coding", "default"))
    starts = [r.messages[1]["content"] for r in block]
    assert len(set(starts)) < len(set(r.messages[1]["content"] for r in PATTERNS["sliding_window"].requests(
        load("coding", "default"))))  # fmt: skip


def test_agent_scale_workload_shape(tokenizer):
    import json

    traj = load("agent", "default")
    assert traj.to_json() == load("agent", "default").to_json()  # a pure function of the seed
    main = [t for t in traj.turns if t.thread == 0]
    assert 40 <= len(main) <= 60 and {t.thread for t in traj.turns} == {0, 1, 2}
    assert 25 <= len(traj.tools) <= 40
    static = traj.system + "\n".join(json.dumps(t) for t in traj.tools)
    assert 15_000 <= len(tokenizer(static, add_special_tokens=False)["input_ids"]) <= 30_000
    results = [m["content"] for t in traj.turns for m in t.new if m["role"] == "tool"]
    assert max(len(tokenizer(r)["input_ids"]) for r in results) > 2000
    assert sum(m["role"] == "user" for t in main for m in t.new) >= 3
    assert all(len(t.assistant.get("tool_calls") or []) <= 1 for t in traj.turns)  # Llama 3.1 takes one


def test_timed_rounds_are_summarised_and_reported(tokenizer, tmp_path):
    """Interleaved rounds -> medians and spreads per request; the curve and the TTFT section render."""
    from kvreuse.benchmarks.patterns.pattern_runner import add_savings
    from kvreuse.benchmarks.patterns.report import write_report
    from kvreuse.benchmarks.patterns.ttft import context_curve, rotated, summarize_rounds
    from tests.test_patterns import FakeEngine, run_all, tiny_trajectory

    assert rotated([1, 2, 3], 1) == [2, 3, 1] and rotated([1, 2, 3], 3) == [1, 2, 3]
    rounds = [list(run_all(FakeEngine(tokenizer), ["append_only", "naive"], tiny_trajectory(), "replayed").values())
              for _ in range(3)]  # fmt: skip
    for r, runs in enumerate(rounds):
        for run in runs:
            for row in run["requests"]:
                row["ttft_s"] = 0.1 * (r + 1) * (2 if run["pattern"] == "naive" else 1)
    merged = summarize_rounds(rounds)
    add_savings(merged)
    ap = next(m for m in merged if m["pattern"] == "append_only")
    assert ap["requests"][0]["ttft_s"] == pytest.approx(0.2) and ap["requests"][0][
        "ttft_max"
    ] == pytest.approx(0.3)
    assert ap["totals"]["ttft_min"] == pytest.approx(0.1 * len(ap["requests"]))
    curve = context_curve(FakeEngine(tokenizer), [64, 128], 2, lambda msg: None)
    assert [c["context"] for c in curve] == [64, 128] and all(c["cold_median"] > 0 for c in curve)
    meta = {"target": "in-process", "model": "fake", "page_size": 16, "max_tokens": 1, "wall_s": 1.0}
    report = write_report({"meta": meta, "runs": [], "timed": merged, "curve": curve}, tmp_path).read_text()
    assert "## TTFT" in report and "min-max" in report and "Inversions" in report
    assert (tmp_path / "ttft.png").exists() and (tmp_path / "ttft_curve.png").exists()
