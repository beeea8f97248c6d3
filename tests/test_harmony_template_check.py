"""``template-check`` on gpt-oss's harmony template (issue 31), with the real o200k-harmony tokenizer.

The stock template drops earlier analysis (a tool call's too, once a final answer follows it): 4 of the
10 default steps break inside the previous turn.  ``keep_analysis`` (the bundled template's append-only
mode: every turn as generated) has none.  In both, a final answer the model ended with ``<|return|>`` is
written ``<|end|>`` in history: a different last token, which is never cached (a sampled token is not
fed back), so it is reported ok with that note rather than as a break.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from kvreuse.chat_templates import check_prefix_stability
from kvreuse.chat_templates.template_check import main as check_main
from kvreuse.runtime.loading.harmony_vocab import hf_tokenizer_dir

RETURN_NOTE = "<|return|> written <|end|>"


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(hf_tokenizer_dir())


def test_stock_template_breaks_where_it_drops_analysis(tok):
    reports = check_prefix_stability(tok, "gpt_oss")
    broken = [(r.conversation, r.step) for r in reports if not r.ok]
    assert broken == [("tools", 8), ("reasoning", 2), ("reasoning", 4), ("reasoning+tools", 3)]
    for r in reports:
        if not r.ok:  # the analysis the model generated is what the next request lacks
            assert "analysis" in r.previous_text and "analysis" not in r.next_text[:20]
    assert sum(RETURN_NOTE in r.note for r in reports) == 3


def test_keep_analysis_is_append_only(tok):
    reports = check_prefix_stability(tok, "gpt_oss", keep_analysis=True)
    assert len(reports) == 10 and all(r.ok for r in reports)
    assert sum(RETURN_NOTE in r.note for r in reports) == 7  # every final answer, nothing else
    stock = {(r.conversation, r.step): r.prefix_tokens for r in check_prefix_stability(tok, "gpt_oss")}
    kept = {(r.conversation, r.step): r.prefix_tokens for r in reports}
    assert all(kept[k] >= stock[k] for k in kept) and sum(kept.values()) > sum(stock.values())


def test_cli_keep_analysis(capsys):
    assert (
        check_main(["--model", str(hf_tokenizer_dir()), "--chat-template", "gpt_oss", "--keep-analysis"]) == 0
    )
    assert "10 steps, 0 break(s)" in capsys.readouterr().out
    assert check_main(["--model", str(hf_tokenizer_dir()), "--chat-template", "gpt_oss"]) == 1


def test_string_arguments_render_as_json_for_gpt_oss_only(tok):
    """OpenAI clients send a call's arguments as a JSON string: gpt-oss's template writes them with
    ``tojson`` (a string would come out quoted), so they are decoded for it; templates with a string
    branch (ChatML, Qwen3) keep the client's string as written."""
    from kvreuse.chat_templates.render import render_text

    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]  # fmt: skip
    tools = [
        {"type": "function", "function": {"name": "f", "description": "F", "parameters": {"type": "object"}}}
    ]
    assert '<|message|>{"a": 1}<|call|>' in render_text(tok, msgs, tools, template="gpt_oss")
    for name in ("chatml", "qwen3"):
        assert '"arguments": {"a":1}}' in render_text(tok, msgs, tools, template=name)
