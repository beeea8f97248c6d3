"""gpt-oss's harmony format: the offline o200k vocabulary, openai-harmony's rendering against the
model's own chat template (``chat_templates/templates/gpt_oss.jinja``) token for token, and the
channel parser (analysis -> reasoning, final -> content, commentary to functions.NAME -> tool calls).

The vocabulary comes from the ``quicktok-v1`` wheel on PyPI (fetched once into the kvreuse cache) and
must hash to tiktoken's published o200k_base SHA-256.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from kvreuse.chat_templates.harmony import HarmonyParser, parse_harmony, render_harmony
from kvreuse.chat_templates.render import load_template
from kvreuse.runtime.loading.harmony_vocab import O200K_SHA256, harmony_encoding, hf_tokenizer_dir, o200k_dir

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "the city"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                    "days": {"type": "integer"},
                },
                "required": ["city"],
            },
        },
    },
]
NO_ARGS = {
    "type": "function",
    "function": {
        "name": "now",
        "description": "The time",
        "parameters": {"type": "object", "properties": {}},
    },
}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
# conversations the two renderers agree on exactly
AGREE = {
    "one user turn": ([{"role": "user", "content": "Hi"}], None),
    "tools and a system prompt": (
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris?"}],
        TOOLS,
    ),
    "earlier reasoning dropped": (
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello.", "reasoning_content": "A greeting."},
            {"role": "user", "content": "What is 2+2?"},
        ],
        TOOLS,
    ),
}


@pytest.fixture(scope="module")
def enc():
    return harmony_encoding()


def _template_text(messages: list[dict], tools, effort: str) -> str:
    """The model's own template, fed as transformers feeds it (``thinking``, arguments as objects)."""
    msgs = []
    for m in messages:
        m = dict(m)
        if "reasoning_content" in m:
            m["thinking"] = m.pop("reasoning_content")
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]
        msgs.append(m)
    src = load_template("gpt_oss", None)
    out, _ = render_jinja_template(
        conversations=[msgs],
        tools=tools,
        chat_template=src,
        add_generation_prompt=True,
        reasoning_effort=effort,
    )
    return out[0]


def test_o200k_ranks_are_tiktokens_own():
    data = (o200k_dir() / "o200k_base.tiktoken").read_bytes()
    assert hashlib.sha256(data).hexdigest() == O200K_SHA256
    assert data.count(b"\n") == 199998


@pytest.mark.parametrize("effort", ["low", "high"])
@pytest.mark.parametrize("name", list(AGREE))
def test_harmony_agrees_with_the_models_template(enc, name, effort):
    messages, tools = AGREE[name]
    ids = render_harmony(enc, messages, tools, effort)
    assert ids == enc.encode(_template_text(messages, tools, effort), allowed_special="all")


def test_known_differences_from_the_models_template(enc):
    """Where they differ, exactly: the template ends a tool-less developer message with a blank line,
    writes a call's content type as `` json`` where harmony writes `` <|constrain|>json`` (what the
    model itself generates), quotes a tool's text result as a JSON string, and types a tool without
    parameters ``() => any`` where harmony writes ``(_: {\n}) => any``; everything else is equal."""
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    ours, theirs = enc.decode(render_harmony(enc, msgs)), _template_text(msgs, None, "medium")
    assert ours != theirs and ours == theirs.replace("Be brief.\n\n<|end|>", "Be brief.<|end|>")
    msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "reasoning_content": "Need the tool.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    ours, theirs = enc.decode(render_harmony(enc, msgs, TOOLS)), _template_text(msgs, TOOLS, "medium")
    assert ours != theirs
    assert ours == theirs.replace(
        "commentary json<|message|>", "commentary <|constrain|>json<|message|>"
    ).replace('<|message|>"sunny"<|end|>', "<|message|>sunny<|end|>")
    msgs = [{"role": "user", "content": "Time?"}]
    ours, theirs = enc.decode(render_harmony(enc, msgs, [NO_ARGS])), _template_text(msgs, [NO_ARGS], "medium")
    assert ours != theirs and ours == theirs.replace("type now = () => any;", "type now = (_: {\n}) => any;")


def test_transformers_tokenizer_matches_harmony(enc):
    """The tokenizer the engine loads (built from the same ranks) gives harmony's ids."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_tokenizer_dir())
    messages, tools = AGREE["tools and a system prompt"]
    text = _template_text(messages, tools, "high") + "  Héllo wörld 123456 don't\n\n\ttabs 🎉 中文"
    assert tok.encode(text, add_special_tokens=False) == enc.encode(text, allowed_special="all")


def test_keep_analysis_keeps_earlier_reasoning(enc):
    messages, tools = AGREE["earlier reasoning dropped"]
    dropped = enc.decode(render_harmony(enc, messages, tools))
    kept = enc.decode(render_harmony(enc, messages, tools, keep_analysis=True))
    assert "A greeting." not in dropped
    assert "<|channel|>analysis<|message|>A greeting.<|end|>" in kept


REPLY = (
    "<|channel|>analysis<|message|>Need the weather.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
    "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)


def test_parser_splits_channels(enc):
    out = parse_harmony(enc, enc.encode(REPLY, allowed_special="all"), "req")
    assert out.reasoning == "Need the weather." and out.content == "Checking."
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [("get_weather", {"city": "Paris"})]
    final = (
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>"
    )
    out = parse_harmony(enc, enc.encode(final, allowed_special="all"))
    assert (out.reasoning, out.content, out.tool_calls) == ("Easy.", "4", [])


def test_parser_streamed_token_by_token_equals_whole(enc):
    ids = enc.encode(REPLY, allowed_special="all")
    p = HarmonyParser(enc, "req")
    deltas = [p.feed([t]) for t in ids] + [p.finish()]
    whole = parse_harmony(enc, ids, "req")
    assert "".join(d.reasoning for d in deltas) == whole.reasoning
    assert "".join(d.content for d in deltas) == whole.content
    calls = [c for d in deltas for c in d.tool_calls]
    assert [(c.id, c.name, c.arguments_delta) for c in calls] == [
        (c.id, c.name, c.arguments) for c in whole.tool_calls
    ]
    assert not any("<|" in d.content + d.reasoning for d in deltas)
