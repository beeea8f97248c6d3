"""template-check finds the Qwen3 reasoning break, passes append-only templates, and exits 1 on a break."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from kvreuse.chat_templates import Conversation, check_prefix_stability, default_conversations
from kvreuse.chat_templates.template_check import main as check_main
from kvreuse.runtime.loading.model_source import resolve_model

THINKING = Conversation(
    "thinking",
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 12 * 7?"},
        {"role": "assistant", "reasoning_content": "12 * 7 = 84.", "content": "84."},
        {"role": "user", "content": "Halve it."},
        {"role": "assistant", "reasoning_content": "84 / 2 = 42.", "content": "42."},
        {"role": "user", "content": "Thanks."},
    ],
)


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(resolve_model(None)[0]))


def test_qwen3_drops_reasoning_break_reported_at_first_assistant_message(tok):
    reports = check_prefix_stability(tok, "qwen3", [THINKING])
    assert [r.step for r in reports] == [2, 4]
    first = reports[0]
    assert not first.ok
    assert first.message_index == 2
    assert "think block" in first.segment
    assert first.previous_text.startswith("<think>\n12 * 7 = 84.")
    assert first.next_text.startswith("84.<|im_end|>")
    assert first.before_text.endswith("<|im_start|>assistant\n")


def test_qwen3_keep_reasoning_is_append_only(tok):
    reports = check_prefix_stability(tok, "qwen3", keep_reasoning=True)
    assert reports and all(r.ok for r in reports)


@pytest.mark.parametrize("name", ["plain", "tools"])
def test_chatml_plain_and_tool_turns_pass(tok, name):
    conv = next(c for c in default_conversations() if c.name == name)
    reports = check_prefix_stability(tok, "chatml", [conv])
    assert len(reports) >= 2 and all(r.ok for r in reports)
    assert all(r.prefix_tokens > 0 for r in reports)


def test_template_that_rewrites_history_is_caught_in_template_glue(tok):
    counting = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% if loop.first %} ({{ messages|length }} messages){% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    reports = check_prefix_stability(tok, counting, [THINKING])
    assert reports[0].divergence is not None and not reports[0].ok
    assert reports[0].before_text.endswith("Be brief. (")
    assert reports[0].previous_text.startswith("2 messages)")
    # already the assistant turn, rendered as the newest message, rewrites the system line
    assert reports[0].next_text.startswith("3 messages)")
    assert "not continued" in reports[0].segment and "template glue" in reports[0].segment


def test_cli_exit_codes(capsys):
    assert check_main(["--chat-template", "qwen3"], resolve_model) == 1
    out = capsys.readouterr().out
    assert "BREAK" in out and "think block (message 2)" in out
    assert check_main(["--chat-template", "chatml"], resolve_model) == 0
    assert "0 break(s)" in capsys.readouterr().out
    assert check_main(["--chat-template", "qwen3", "--keep-reasoning"], resolve_model) == 0
    assert check_main(["--chat-template", "nope"], resolve_model) == 2


def test_gemma3_turns_are_append_only_and_tool_turns_are_refused(tok, capsys):
    """Gemma 3's template (bundled as ``gemma3``): the system prompt folds into the first user turn,
    the assistant is ``model``; it raises on tool turns, which template-check reports, not as a break."""
    from kvreuse.chat_templates.render import render

    msgs = [{"role": "system", "content": "Be helpful."}, {"role": "user", "content": "Hello"}]
    text = render(tok, msgs, None, template="gemma3", add_generation_prompt=True).text
    bos = tok.bos_token or ""
    assert text == bos + "<start_of_turn>user\nBe helpful.\n\nHello<end_of_turn>\n<start_of_turn>model\n"
    reports = check_prefix_stability(tok, "gemma3")
    plain = [r for r in reports if not r.refused]
    assert {r.conversation for r in plain} == {"plain", "reasoning"} and all(r.ok for r in plain)
    assert {r.conversation for r in reports if r.refused} == {"tools", "reasoning+tools"}
    assert check_main(["--chat-template", "gemma3"], resolve_model) == 0
    assert "2 conversation(s) refused" in capsys.readouterr().out
