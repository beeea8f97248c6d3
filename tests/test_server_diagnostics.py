"""Cache-miss diagnostics on real renderings (embedded tokenizer, bundled ChatML template, no model):
each kind of prefix break is located in the right message/segment and given the right cause."""

from __future__ import annotations

import copy
import json

import pytest
from transformers import AutoTokenizer

from kvreuse.chat_templates.render import first_divergence, render
from kvreuse.runtime.loading.model_source import resolve_model
from kvreuse.runtime.server.diagnostics import CacheDiagnostics, HistoryEntry

PAGE = 16


def _tool(name: str) -> dict:
    params = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    return {
        "type": "function",
        "function": {"name": name, "description": f"Tool {name}.", "parameters": params},
    }


TOOLS = [_tool("search"), _tool("fetch"), _tool("summarize")]


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(resolve_model(None)[0]))


def _conversation() -> list[dict]:
    msgs = [{"role": "system", "content": "You are an agent. Current time: 2025-06-01 10:00:00. Be brief."}]
    for k in range(4):
        msgs.append({"role": "user", "content": f"Question number {k} about topic {k * 7}?"})
        msgs.append({"role": "assistant", "content": f"Answer number {k}: it is {k * 3}."})
    msgs.append({"role": "user", "content": "Final question?"})
    return msgs


def _diagnose(tok, old_msgs, new_msgs, old_tools=TOOLS, new_tools=TOOLS, cached=None):
    diag = CacheDiagnostics(tok, PAGE)
    old = render(tok, old_msgs, old_tools, template="chatml")
    generated = tok.encode("Sure.<|im_end|>", add_special_tokens=False)
    diag.record(HistoryEntry(old.token_ids + generated, len(old.token_ids), old_msgs, old_tools))
    new = render(tok, new_msgs, new_tools, template="chatml")
    if cached is None:  # what the radix cache would report: whole pages of the common prefix
        common = first_divergence(old.token_ids + generated, new.token_ids)
        cached = min(common // PAGE * PAGE, len(new.token_ids) - 1)
    return diag.diagnose(new, new_msgs, new_tools, new.token_ids, cached), new


def test_timestamp_change_in_system_message(tok):
    old = _conversation()
    new = copy.deepcopy(old)
    new[0]["content"] = new[0]["content"].replace("10:00:00", "10:00:07")
    d, rendered = _diagnose(tok, old, new)
    assert d["cause"] == "system_changed" and "char" in d["detail"]
    div = d["divergence"]
    assert div["segment"] == "system" and div["message_index"] == 0 and div["where"] == "message 0 (system)"
    assert "10:00:07" in div["before_text"] + div["new_text"] and div["new_text"].startswith("7")
    assert "10:00:00" not in json.dumps(d)  # the earlier request's text is never shown
    # The named token really is where the two renderings part.
    assert rendered.text.find("10:00:07") <= len(tok.decode(rendered.token_ids[: div["token_index"] + 1]))


def test_reordered_tools(tok):
    msgs = _conversation()
    d, _ = _diagnose(tok, msgs, msgs, new_tools=[TOOLS[1], TOOLS[0], TOOLS[2]])
    assert d["cause"] == "tools_reordered"
    assert d["divergence"]["segment"] == "tools" and d["divergence"]["message_index"] is None


def test_changed_tools(tok):
    msgs = _conversation()
    d, _ = _diagnose(tok, msgs, msgs, new_tools=[TOOLS[0], _tool("browse"), TOOLS[2]])
    assert d["cause"] == "tools_changed" and d["divergence"]["segment"] == "tools"


def test_dropped_early_history(tok):
    old = _conversation()
    new = [old[0], *old[3:]]  # sliding window: the first user/assistant exchange is gone
    d, _ = _diagnose(tok, old, new)
    assert d["cause"] == "history_truncated" and "first 2" in d["detail"]
    div = d["divergence"]
    assert div["message_index"] == 1 and div["segment"] == "message"
    assert div["before_text"].endswith("Question number ")  # the texts part right at the number
    assert div["new_text"].startswith("1 about topic 7") and "cached_text" not in div


def test_edited_message(tok):
    old = _conversation()
    new = copy.deepcopy(old)
    new[4]["content"] = "Answer number 1: it is 4."
    d, _ = _diagnose(tok, old, new)
    assert d["cause"] == "message_edited" and d["divergence"]["message_index"] == 4


def test_appended_turn_is_a_hit_and_eviction_is_named(tok):
    old = _conversation()
    new = [*old, {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "More?"}]
    d, _ = _diagnose(tok, old, new)
    assert d["cause"] == "append_only" and d["divergence"] is None
    assert d["reusable_tokens"] >= len(render(tok, old, TOOLS, template="chatml").token_ids)
    d, _ = _diagnose(tok, old, new, cached=0)  # same prefix, but the engine found nothing cached
    assert d["cause"] == "evicted" and "evicted" in d["detail"]


def test_template_rerendering_earlier_turns(tok):
    # Qwen3 keeps reasoning only after the last user message: once a new user turn arrives, an
    # earlier assistant turn renders without its <think> block although no message changed.
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}
    old = [
        {"role": "user", "content": "Look it up."},
        {"role": "assistant", "reasoning_content": "I should search.", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ]
    new = [*old, {"role": "assistant", "content": "Found it."}, {"role": "user", "content": "Thanks, next?"}]
    diag = CacheDiagnostics(tok, PAGE)
    before = render(tok, old, TOOLS, template="qwen3")
    assert "I should search." in before.text
    diag.record(HistoryEntry(before.token_ids, len(before.token_ids), old, TOOLS))
    after = render(tok, new, TOOLS, template="qwen3")
    assert "I should search." not in after.text
    common = first_divergence(before.token_ids, after.token_ids)
    d = diag.diagnose(after, new, TOOLS, after.token_ids, common // PAGE * PAGE)
    at = d["divergence"]["token_index"]
    assert d["cause"] == "template_rerendered", d
    assert d["divergence"]["message_index"] == 1 and at <= d["reusable_tokens"] + PAGE
    assert "search." not in json.dumps(d)  # the earlier turn's reasoning is named, never shown


def test_unrelated_request_is_a_new_conversation(tok):
    d, _ = _diagnose(tok, _conversation(), [{"role": "user", "content": "Hello"}], new_tools=None)
    assert d["cause"] == "new_conversation"


def test_cached_beyond_any_remembered_request_is_precomputed(tok):
    """A replica reading a prefix from the shared tier (or a prewarm) has no earlier request to match:
    the hit is named for where it came from, not called a new conversation."""
    new = _conversation()
    rendered = render(tok, new, TOOLS, template="chatml")
    cached = (len(rendered.token_ids) - 1) // PAGE * PAGE
    fresh = CacheDiagnostics(tok, PAGE).diagnose(rendered, new, TOOLS, rendered.token_ids, cached)
    assert fresh["cause"] == "precomputed" and f"{cached} tokens were cached" in fresh["detail"], fresh
    d, _ = _diagnose(tok, [{"role": "user", "content": "Hello"}], new, cached=cached)
    assert d["cause"] == "precomputed" and d["reusable_tokens"] < cached - PAGE, d
    d, _ = _diagnose(tok, [{"role": "user", "content": "Hello"}], new, cached=0)
    assert d["cause"] == "new_conversation", d
