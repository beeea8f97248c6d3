"""``parallel_tool_calls: false`` (and Anthropic's ``disable_parallel_tool_use``) under ``tool_choice``
auto: the grammar allows free text or one tool call, in every tool-call format the templates emit
(Hermes / Qwen3 JSON, Qwen3.5 XML, Llama 3 JSON), never a second call.

Checked on the embedded model's real vocabulary with llguidance itself: each text is tokenized as the
model would write it and fed to the grammar's matcher.  The texts are first read by the output parser,
so "one call" and "two calls" are what the server would return.
"""

from __future__ import annotations

import llguidance
import llguidance.hf
import openai
import pytest
import transformers
from fastapi.testclient import TestClient

from kvreuse.chat_templates.parsers import parse_full
from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.loading.model_source import resolve_model
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.core.constraints import tool_grammar
from kvreuse.runtime.server.core.prompting import ChatInput
from kvreuse.runtime.server.state import ServerConfig

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": WEATHER}}
    for name in ("get_weather", "get_time")
]
TEXT = "Paris is sunny today; I can check {more} if you like."


def _hermes(city: str) -> str:
    return f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>'


def _xml(city: str) -> str:
    return f"<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n</function>\n</tool_call>"


def _llama(city: str) -> str:
    return f'{{"name": "get_weather", "parameters": {{"city": "{city}"}}}}'


# format -> (one call, two calls), each as the model writes it
CASES = {
    "hermes": (f"Let me check.\n{_hermes('Paris')}", f"{_hermes('Paris')}\n{_hermes('Rome')}"),
    "qwen_xml": (f"Let me check.\n{_xml('Paris')}", f"{_xml('Paris')}\n{_xml('Rome')}"),
    "llama3": (_llama("Paris"), f"{_llama('Paris')}; {_llama('Rome')}"),
}


@pytest.fixture(scope="module")
def tokenizer():
    hf = transformers.AutoTokenizer.from_pretrained(str(resolve_model(None)[0]))
    return hf, llguidance.hf.from_tokenizer(hf, n_vocab=len(hf), eos_token=hf.eos_token_id)


def _accepts(tokenizer, source: str, text: str) -> bool:
    """Whether the grammar takes ``text`` (as the model's tokens) and then the end of the output."""
    hf, llg = tokenizer
    m = llguidance.LLMatcher(llg, source, log_level=0)
    assert not m.is_error(), m.get_error()
    for t in hf.encode(text, add_special_tokens=False):
        if not m.consume_token(t):
            return False
    return m.consume_token(hf.eos_token_id) and (m.is_accepting() or m.is_stopped())


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_auto_without_parallel_calls_is_text_or_one_call(tokenizer, fmt):
    one, two = CASES[fmt]
    assert [len(parse_full(t, fmt).tool_calls) for t in (TEXT, one, two)] == [0, 1, 2]
    single = tool_grammar(ChatInput([], TOOLS, "auto", None, None, None, False), fmt)
    assert single is not None, f"no single-call grammar for {fmt}"
    assert _accepts(tokenizer, single.source, TEXT)
    assert _accepts(tokenizer, single.source, one)
    assert not _accepts(tokenizer, single.source, two)
    assert tool_grammar(ChatInput([], TOOLS, "auto", None, None, None, True), fmt) is None  # free


@pytest.fixture(scope="module")
def engine():
    return AsyncEngine(Engine(None, kv_cache_memory="64M", max_model_len=2048))


@pytest.mark.parametrize("template", ["chatml", "qwen3_5", "llama3"])
def test_prose_cut_by_max_tokens_is_the_free_answer(engine, template):
    """A text answer under the single-call grammar is the unconstrained answer, token for token, up to
    its very end: the wrap-up that closes JSON near ``max_tokens`` has no place in prose (it used to
    turn the last 24 tokens into quotes)."""
    config = ServerConfig("smol", allowed_hosts=("testserver",), chat_template=template)
    with TestClient(create_app(engine, config), raise_server_exceptions=False) as http:
        oa = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
        kwargs = dict(model="smol", messages=[{"role": "user", "content": "Write a short poem about the sea."}],
                      tools=TOOLS, tool_choice="auto", max_tokens=40, temperature=0)  # fmt: skip
        free, single = (
            oa.chat.completions.create(**kwargs, parallel_tool_calls=p).choices[0] for p in (True, False)
        )
    assert free.finish_reason == single.finish_reason == "length" and not single.message.tool_calls
    assert single.message.content == free.message.content, (single.message.content, free.message.content)
