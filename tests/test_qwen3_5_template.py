"""Qwen3.5's bundled chat template: XML tool calls parsed back exactly, JSON-string arguments rendered,
and the prefix check (reasoning dropped by the published template; append-only with keep_reasoning)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from kvreuse.chat_templates import check_prefix_stability, default_conversations
from kvreuse.chat_templates.parsers import OutputParser, parse_full
from kvreuse.chat_templates.render import render_text
from kvreuse.runtime.loading.model_source import resolve_model
from kvreuse.runtime.server.templates import forced_tool_prefix, resolve_template

OUTPUT = (
    "Paris first.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
    '</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{"unit": "c"}\n</parameter>\n'
    "</function>\n</tool_call>"
)


@pytest.fixture(scope="module")
def tok():
    t = AutoTokenizer.from_pretrained(str(resolve_model(None)[0]))
    # Qwen's vocabularies have these as single added tokens
    t.add_tokens(
        ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
    )
    return t


def test_xml_tool_call_parsed_whole_and_streamed():
    full = parse_full(OUTPUT, "qwen_xml", True, True, "r")
    assert full.reasoning == "Paris first."
    assert full.content == "Checking."
    (call,) = full.tool_calls
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris", "days": 3, "opts": {"unit": "c"}}
    p = OutputParser("qwen_xml", True, True, "r")
    content, calls = "", []
    for ch in OUTPUT:  # one character at a time: no markup may leak
        d = p.feed(ch)
        content, calls = content + d.content, calls + d.tool_calls
    d = p.finish()
    assert content + d.content == "Checking."
    assert [(c.name, c.arguments_delta) for c in calls + d.tool_calls] == [(call.name, call.arguments)]


def test_malformed_xml_call_stays_content():
    bad = "<tool_call>\n<function=f>\nstray</function>\n</tool_call>"
    out = parse_full(bad, "qwen_xml")
    assert out.tool_calls == [] and out.content == bad


def test_rendered_call_is_what_the_model_wrote(tok):
    """The parsed call, sent back as OpenAI JSON-string arguments, renders as the generated markup."""
    call = parse_full(OUTPUT, "qwen_xml", True, True, "r").tool_calls[0]
    msgs = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Paris first.",
         "tool_calls": [{"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
    ]  # fmt: skip
    text = render_text(tok, msgs, template="qwen3_5", add_generation_prompt=False)
    assert "<|im_start|>assistant\n<think>\n" + OUTPUT + "<|im_end|>" in text


def test_server_picks_the_xml_format(tok):
    info = resolve_template(tok, "qwen3_5")
    assert info.tool_format == "qwen_xml" and info.reasoning
    assert forced_tool_prefix("qwen_xml", "get_weather") == "<tool_call>\n<function=get_weather>\n"
    assert resolve_template(tok, "qwen3").tool_format == "hermes"


def test_published_template_drops_earlier_reasoning(tok):
    conv = next(c for c in default_conversations() if c.name == "reasoning")
    reports = check_prefix_stability(tok, "qwen3_5", [conv])
    assert not reports[0].ok and reports[0].message_index == 2 and "think block" in reports[0].segment


def test_keep_reasoning_without_thinking_is_append_only_in_text(tok):
    """Every step's text extends the last.  SmolLM2's merges split ``</think>\n\n`` + content differently
    from the generated tokens; the Qwen vocabulary does not (0 breaks: chat_templates/README.md)."""
    reports = check_prefix_stability(tok, "qwen3_5", enable_thinking=False, keep_reasoning=True)
    assert len(reports) >= 8 and all(r.ok or "same text, different token split" in r.segment for r in reports)


def test_keep_reasoning_keeps_reasoning_turns_append_only(tok):
    convs = [c for c in default_conversations() if c.name.startswith("reasoning")]
    reports = check_prefix_stability(tok, "qwen3_5", convs, keep_reasoning=True)
    assert reports and all(r.ok for r in reports)
