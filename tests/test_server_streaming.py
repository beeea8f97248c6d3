"""SSE chat chunks from a fake engine stream: tool calls split at every awkward boundary assemble into
exactly the calls the non-streamed parser finds; leaving a merged stream early closes every source."""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvreuse.chat_templates.parsers import parse_full
from kvreuse.runtime.engine.outputs import RequestOutput
from kvreuse.runtime.server.core.streaming import merge_streams
from kvreuse.runtime.server.openai.chat import ChatCompletionRun, complete, stream_events
from kvreuse.runtime.server.openai.protocol import ChatCompletionRequest
from kvreuse.runtime.server.openai.usage import StreamUsage
from kvreuse.runtime.server.templates import TemplateInfo

OUTPUT = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"city": "Rome", "tz": "CET"}}\n</tool_call>'
)


def _out(delta: str, text: str, finished: bool) -> RequestOutput:
    return RequestOutput(
        "r", [1, 2, 3], [7] * len(delta), delta, [], finished, "stop" if finished else None,
        2, 1, 0.1, 0.1, 0.2 if finished else None, 0.3 if finished else None,
        output_token_ids=[7] * len(text) if finished else [], text=text if finished else "",
    )  # fmt: skip


class FakeRun(ChatCompletionRun):
    """A chat completion run whose engine stream replays ``pieces`` (no engine, no model)."""

    def __init__(self, pieces: list[str], body: dict) -> None:
        self.req = ChatCompletionRequest(**body)
        self.id, self.created, self.model = "chatcmpl-test", 0, "m"
        template = TemplateInfo("chatml", "", "hermes", False)
        self.state = SimpleNamespace(template=template, tokenizer=None)
        self.prompt = SimpleNamespace(
            token_ids=[1, 2, 3], forced_prefix="", tool_format="hermes", think_open=False
        )
        self.prompt_ids = self.prompt.token_ids
        self.prompts = [self.prompt_ids]
        self.fingerprint = "fp_test"
        self.stream_usage = StreamUsage(self.req.stream_options)
        self.pieces = pieces
        self.clamp = None  # EngineRun.__init__ (not run here) sets it: no max_tokens clamp

    async def _replay(self):
        text = ""
        for k, piece in enumerate(self.pieces):
            text += piece
            yield 0, _out(piece, text, k == len(self.pieces) - 1)

    def streams(self):
        return self._replay()

    def finish(self, outs):
        return {"cache": {"cause": "fake"}}


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:])] or [text]


async def _collect(run: FakeRun) -> list[dict]:
    events = [e async for e in stream_events(run)]
    assert events[-1] == "data: [DONE]\n\n"
    return [json.loads(e[len("data: ") :]) for e in events[:-1]]


def _assemble(chunks: list[dict]) -> tuple[str, list[tuple[str, str, str]], str | None]:
    content, calls, finish = "", {}, None
    for c in chunks:
        for ch in c["choices"]:
            d = ch["delta"]
            content += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], ["", "", ""])
                slot[0] = tc.get("id") or slot[0]
                slot[1] += tc.get("function", {}).get("name") or ""
                slot[2] += tc.get("function", {}).get("arguments") or ""
            finish = ch["finish_reason"] or finish
    return content, [tuple(calls[i]) for i in sorted(calls)], finish


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(OUTPUT)), max_size=12))
def test_streamed_tool_calls_assemble_like_non_streamed(cuts):
    run = FakeRun(_split(OUTPUT, cuts), {"messages": [{"role": "user", "content": "hi"}], "stream": True})
    chunks = asyncio.run(_collect(run))
    content, calls, finish = _assemble(chunks)
    whole = parse_full(OUTPUT, "hermes", request_id="chatcmpl-test-0")
    assert content == whole.content == "Let me check."
    assert calls == [(c.id, c.name, c.arguments) for c in whole.tool_calls]
    assert [c[1] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[1][2]) == {"city": "Rome", "tz": "CET"}
    assert finish == "tool_calls"
    assert not any("<tool_call>" in (ch["delta"].get("content") or "") for c in chunks for ch in c["choices"])
    final = next(c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
    assert not any("usage" in c for c in chunks)  # not asked for: no chunk carries usage
    assert final["kvreuse"] == {"cache": {"cause": "fake"}}


def test_include_usage_adds_a_usage_only_chunk():
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = asyncio.run(_collect(FakeRun(["Hello", " there"], body)))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len("Hello there")
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 2
    assert chunks[-1]["kvreuse"] == {"cache": {"cause": "fake"}}
    assert all(c["usage"] is None and "kvreuse" not in c for c in chunks[:-1])  # exactly one usage
    assert _assemble(chunks)[0] == "Hello there" and _assemble(chunks)[2] == "stop"


MALFORMED = [
    'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',  # never closed
    '<tool_call>\n{"name": "get_weather", "arguments": {"city"}}\n</tool_call>',  # bad JSON, closed
    '<tool_call>\n{"arguments": {"city": "Rome"}}\n</tool_call> done',  # no name
]


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_tool_markup_under_auto_is_content_with_stop(text):
    """#14 point 4: never a half-parsed call; the text as written goes to content, finish_reason stop."""
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [], "tool_choice": "auto"}
    streamed = asyncio.run(_collect(FakeRun([text[:7], text[7:30], text[30:]], {**body, "stream": True})))
    content, calls, finish = _assemble(streamed)
    plain = asyncio.run(complete(FakeRun([text], body)))["choices"][0]
    assert calls == [] and finish == "stop" and "tool_calls" not in plain["message"]
    assert plain["finish_reason"] == "stop" and plain["message"]["content"] == content
    assert content.replace("\n", "") == text.replace("\n", "").strip()


def test_closing_tag_inside_a_json_string_is_not_the_end_of_the_call():
    text = '<tool_call>\n{"name": "search", "arguments": {"query": "a</tool_call>b"}}\n</tool_call>'
    chunks = asyncio.run(
        _collect(
            FakeRun([text[:40], text[40:]], {"messages": [{"role": "user", "content": "x"}], "stream": True})
        )
    )
    content, calls, finish = _assemble(chunks)
    assert content == "" and [c[1] for c in calls] == ["search"] and finish == "tool_calls"
    assert json.loads(calls[0][2]) == {"query": "a</tool_call>b"}


def test_leaving_a_merged_stream_early_closes_every_source():
    closed: list[int] = []

    async def source(i: int):
        try:
            for k in range(1000):
                await asyncio.sleep(0)
                yield _out(str(k), str(k), False)
        finally:
            closed.append(i)

    async def main() -> int:
        seen = 0
        async with aclosing(merge_streams([source(0), source(1), source(2)])) as merged:
            async for _ in merged:
                seen += 1
                if seen == 5:
                    break
        assert sorted(closed) == [0, 1, 2]  # closed when the consumer left, not at loop shutdown
        return seen

    assert asyncio.run(main()) == 5


def test_merged_stream_reraises_a_source_error():
    async def bad():
        yield _out("a", "a", False)
        raise ValueError("boom")

    async def main():
        return [o async for o in merge_streams([bad()])]

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(main())
