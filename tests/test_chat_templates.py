"""Golden tests: our rendering equals transformers' apply_chat_template and the published formats."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from kvreuse.chat_templates import first_divergence, load_template, locate, render
from kvreuse.runtime.loading.model_source import resolve_model

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# Written by hand: json.dumps of WEATHER as Qwen3 / Hermes templates print it (tojson, one line).
WEATHER_LINE = (
    '{"type": "function", "function": {"name": "get_weather", "description": "Get the weather.", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}'
)
WEATHER_INDENT4 = """{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {
                    "type": "string"
                }
            },
            "required": [
                "city"
            ]
        }
    }
}"""
QWEN_TOOLS_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + WEATHER_LINE
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
)
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
LLAMA_HEAD = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
LLAMA_DATE = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"

CASES = [
    (
        "chatml system+user",
        "chatml",
        [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"}],
        None,
        {},
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "chatml tool call + tool response",
        "chatml",
        [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        [WEATHER],
        {},
        "<|im_start|>system\n" + QWEN_TOOLS_SYSTEM + "<|im_start|>user\nWeather?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n<|im_start|>tool\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n",
    ),
    (
        "qwen3 tools with system",
        "qwen3",
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}],
        [WEATHER],
        {},
        "<|im_start|>system\nBe brief.\n\n"
        + QWEN_TOOLS_SYSTEM
        + "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "qwen3 tool call + grouped tool responses",
        "qwen3",
        [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL, CALL]},
            {"role": "tool", "content": "sunny"},
            {"role": "tool", "content": "windy"},
        ],
        [WEATHER],
        {},
        "<|im_start|>system\n"
        + QWEN_TOOLS_SYSTEM
        + "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nwindy\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "qwen3 multi-turn drops earlier reasoning",
        "qwen3",
        [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "reasoning_content": "Add.", "content": "4."},
            {"role": "user", "content": "Thanks"},
        ],
        None,
        {},
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4.<|im_end|>\n"
        "<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "qwen3 multi-turn keep_reasoning",
        "qwen3",
        [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "<think>\nAdd.\n</think>\n\n4."},
            {"role": "user", "content": "Thanks"},
        ],
        None,
        {"keep_reasoning": True},
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nAdd.\n</think>\n\n4.<|im_end|>\n"
        "<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "qwen3 thinking on",
        "qwen3",
        [{"role": "user", "content": "Hi"}],
        None,
        {"enable_thinking": True},
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "qwen3 thinking off",
        "qwen3",
        [{"role": "user", "content": "Hi"}],
        None,
        {"enable_thinking": False},
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    ),
    (
        "llama3 system+user",
        "llama3",
        [{"role": "system", "content": " You are helpful. "}, {"role": "user", "content": "Hi"}],
        None,
        {"bos_token": "<|begin_of_text|>"},
        LLAMA_HEAD + LLAMA_DATE + "You are helpful.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi"
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
    (
        "llama3 tools, tool call, ipython result",
        "llama3",
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "tool_calls": [CALL]},
            {"role": "tool", "content": "sunny"},
        ],
        [WEATHER],
        {"bos_token": "<|begin_of_text|>"},
        LLAMA_HEAD
        + "Environment: ipython\n"
        + LLAMA_DATE
        + "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
        "Given the following functions, please respond with a JSON for a function call with its proper "
        "arguments that best answers the given prompt.\n\n"
        'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
        "Do not use variables.\n\n" + WEATHER_INDENT4 + "\n\nWeather in Paris?<|eot_id|>"
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}'
        '<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"sunny"<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
]


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(resolve_model(None)[0]))


@pytest.mark.parametrize("name,template,messages,tools,kwargs,expected", CASES, ids=[c[0] for c in CASES])
def test_golden_matches_published_format_and_transformers(
    tok, name, template, messages, tools, kwargs, expected
):
    ours = render(tok, messages, tools, template=template, **kwargs)
    assert ours.text == expected
    source = load_template(template, tok)
    ref_text = tok.apply_chat_template(
        messages, tools=tools, chat_template=source, add_generation_prompt=True, tokenize=False, **kwargs
    )
    ref_ids = tok.apply_chat_template(
        messages, tools=tools, chat_template=source, add_generation_prompt=True, return_dict=False, **kwargs
    )
    assert ours.text == ref_text
    assert ours.token_ids == list(ref_ids)


def test_default_template_is_the_tokenizers_own(tok):
    msgs = [{"role": "user", "content": "Hello"}]
    ours = render(tok, msgs)
    assert ours.token_ids == list(
        tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
    )
    assert ours.text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_segments_cover_text_and_tokens_in_order(tok):
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "reasoning_content": "Look it up.", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "sunny"},
    ]
    r = render(tok, msgs, [WEATHER], template="qwen3")
    assert r.segments[0].char_start == 0 and r.segments[-1].char_end == len(r.text)
    assert r.segments[0].token_start == 0 and r.segments[-1].token_end == len(r.token_ids)
    for a, b in zip(r.segments, r.segments[1:], strict=False):
        assert a.char_end == b.char_start and a.token_end == b.token_start
    by_kind = {(s.kind, s.message_index): r.text[s.char_start : s.char_end] for s in r.segments}
    assert by_kind[("system", 0)] == "Be brief."
    assert "get_weather" in by_kind[("tools", None)]
    assert by_kind[("message", 1)] == "Weather?"
    assert by_kind[("think", 2)] == "<think>\nLook it up.\n</think>\n\n"
    assert by_kind[("message", 3)] == "sunny"
    assert by_kind[("generation_prompt", None)] == "<|im_start|>assistant\n"
    seg = next(s for s in r.segments if s[:2] == ("message", 3))
    assert tok.decode(r.token_ids[seg.token_start : seg.token_end]) == "sunny"
    assert all(locate(r, t) == seg for t in range(seg.token_start, seg.token_end))
    assert locate(r, len(r.token_ids) - 1).kind == "generation_prompt"


def test_think_inside_content_is_attributed_to_its_message(tok):
    msgs = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<think>\nR\n</think>\n\nA."}]
    r = render(tok, msgs, template="qwen3", add_generation_prompt=False)
    kinds = [(s.kind, s.message_index, r.text[s.char_start : s.char_end]) for s in r.segments]
    assert ("think", 1, "<think>\nR\n</think>\n\n") in kinds and ("message", 1, "A.") in kinds


def test_load_template_errors_and_paths(tok, tmp_path):
    with pytest.raises(ValueError, match="chatml, qwen3, llama3"):
        load_template("no-such-template", tok)
    p = tmp_path / "t.jinja"
    p.write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    assert render(tok, [{"role": "user", "content": "x"}], template=str(p)).text == "[x]"


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([], [1]) == 0
