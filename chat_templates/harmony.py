"""The harmony chat format of gpt-oss, through ``openai-harmony`` (OpenAI's renderer and parser).

``render_harmony`` turns OpenAI-style messages into harmony's token ids as the model's own chat
template does (``tests/test_harmony.py`` measures the two token for token): a system message with the
reasoning effort and the date, a developer message with the system prompt's text as instructions and
the tools as a TypeScript namespace, user turns, assistant turns (``reasoning_content`` /
``thinking`` in the ``analysis`` channel, the reply in ``final``, tool calls in ``commentary`` to
``functions.NAME`` as JSON) and tool results (from ``functions.NAME`` to the assistant).  Earlier
turns' analysis is dropped as the template drops it (harmony's ``auto_drop_analysis``), unless
``keep_analysis`` (append-only history: every turn rendered as generated, so the next request
extends this one's tokens).

``HarmonyParser`` splits generated token ids into the channels, incrementally (``StreamableParser``):
``analysis`` -> reasoning, ``final`` -> content, a ``commentary`` message to ``functions.NAME`` -> a
tool call (emitted whole when its message ends); a plain ``commentary`` message (a preamble) is content.

The encoding needs the o200k ranks; ``kvreuse.runtime.loading.harmony_vocab.harmony_encoding`` loads them
offline (this package imports nothing of ``runtime``: callers pass the encoding in).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    HarmonyError,
    Message,
    ReasoningEffort,
    RenderConversationConfig,
    Role,
    StreamableParser,
    SystemContent,
    ToolDescription,
)

from kvreuse.chat_templates.tool_calls import CallIds, ParsedDelta, ParsedOutput, ToolCall, ToolCallDelta

EFFORTS = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def _tool(spec: dict) -> ToolDescription:
    fn = spec.get("function", spec)
    return ToolDescription.new(fn["name"], fn.get("description", ""), parameters=fn.get("parameters"))


def harmony_messages(
    messages: Sequence[dict],
    tools: Sequence[dict] | None = None,
    reasoning_effort: str = "medium",
    date: str | None = None,
) -> list[Message]:
    """OpenAI-style ``messages`` (+ ``tools``) as harmony messages: system (effort, date), developer
    (system prompt, tools), then the turns."""
    if reasoning_effort not in EFFORTS:
        raise ValueError(f"reasoning_effort must be one of {', '.join(EFFORTS)}, not {reasoning_effort!r}")
    date = date or datetime.date.today().strftime("%Y-%m-%d")
    system = (
        SystemContent.new()
        .with_reasoning_effort(EFFORTS[reasoning_effort])
        .with_conversation_start_date(date)
    )
    out = [Message.from_role_and_content(Role.SYSTEM, system)]
    instructions = "\n\n".join(
        _text(m.get("content")) for m in messages if m["role"] in ("system", "developer")
    )
    if instructions or tools:
        dev = DeveloperContent.new()
        if instructions:
            dev = dev.with_instructions(instructions)
        if tools:
            dev = dev.with_function_tools([_tool(t) for t in tools])
        out.append(Message.from_role_and_content(Role.DEVELOPER, dev))
    call_names: dict[str, str] = {}
    for m in messages:
        role = m["role"]
        if role == "user":
            out.append(Message.from_role_and_content(Role.USER, _text(m.get("content"))))
        elif role == "assistant":
            out.extend(_assistant(m, call_names))
        elif role == "tool":
            name = m.get("name") or call_names.get(m.get("tool_call_id", ""), "tool")
            msg = Message.from_author_and_content(
                Author.new(Role.TOOL, f"functions.{name}"), _text(m["content"])
            )
            out.append(msg.with_channel("commentary").with_recipient("assistant"))
        elif role not in ("system", "developer"):
            raise ValueError(f"unknown message role {role!r}")
    return out


def _assistant(m: dict, call_names: dict[str, str]) -> list[Message]:
    out = []
    thinking = m.get("reasoning_content") or m.get("thinking")
    if thinking:
        out.append(Message.from_role_and_content(Role.ASSISTANT, thinking).with_channel("analysis"))
    for call in m.get("tool_calls") or []:
        fn = call["function"]
        args = fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(fn["arguments"])
        call_names[call.get("id", "")] = fn["name"]
        msg = Message.from_role_and_content(Role.ASSISTANT, args).with_channel("commentary")
        out.append(msg.with_recipient(f"functions.{fn['name']}").with_content_type("<|constrain|>json"))
    content = _text(m.get("content"))
    if content or not out:
        out.append(Message.from_role_and_content(Role.ASSISTANT, content).with_channel("final"))
    return out


def render_harmony(
    encoding: HarmonyEncoding,
    messages: Sequence[dict],
    tools: Sequence[dict] | None = None,
    reasoning_effort: str = "medium",
    date: str | None = None,
    keep_analysis: bool = False,
) -> list[int]:
    """Token ids of the conversation followed by ``<|start|>assistant`` (the generation prompt)."""
    convo = Conversation.from_messages(harmony_messages(messages, tools, reasoning_effort, date))
    config = RenderConversationConfig(auto_drop_analysis=not keep_analysis)
    return encoding.render_conversation_for_completion(convo, Role.ASSISTANT, config)


class HarmonyParser:
    """One request's generated token ids -> reasoning / content / tool calls, as they stream."""

    def __init__(self, encoding: HarmonyEncoding, request_id: str | None = None, calls: bool = True) -> None:
        """``calls`` False (``tool_choice: "none"``): a message to a function is content, not a call."""
        self._parser = StreamableParser(encoding, Role.ASSISTANT, strict=False)
        self._encoding = encoding
        self._parse_calls = calls
        self._broken = False
        self._ids = CallIds(request_id)
        self._done = 0  # messages already turned into tool calls
        self._calls = 0

    def feed(self, token_ids: Sequence[int]) -> ParsedDelta:
        """Parse newly generated tokens; text deltas of the open message, and tool calls that closed.

        Output that breaks the format (a header that does not parse) is content from there on, as
        its text: never lost, never an exception."""
        out = ParsedDelta("", "", [])
        for i, t in enumerate(token_ids):
            if self._broken:
                return _join(out, ParsedDelta(self._encoding.decode(list(token_ids[i:])), "", []))
            try:
                self._parser.process(t)
            except HarmonyError:
                self._broken = True
                return _join(out, ParsedDelta(self._encoding.decode(list(token_ids[i:])), "", []))
            out = _join(out, self._delta())
        return out

    def finish(self) -> ParsedDelta:
        """End of output (a stop token, or the token limit): close the open message; a header cut
        short carries nothing yet and is dropped."""
        if self._broken:
            return ParsedDelta("", "", [])
        try:
            self._parser.process_eos()
        except HarmonyError:
            return ParsedDelta("", "", [])
        return self._delta(final=True)

    def _delta(self, final: bool = False) -> ParsedDelta:
        p = self._parser
        text = "" if final else p.last_content_delta or ""
        content = reasoning = ""
        if text and (p.current_recipient is None or not self._parse_calls):  # a call is emitted whole, below
            if p.current_channel == "analysis":
                reasoning = text
            else:
                content = text
        calls = []
        for m in p.messages[self._done :] if self._parse_calls else []:
            if m.recipient and m.recipient.startswith("functions."):
                args = "".join(c.text for c in m.content)
                calls.append(ToolCallDelta(self._calls, self._ids(self._calls), m.recipient[10:], args))
                self._calls += 1
        self._done = len(p.messages)
        return ParsedDelta(content, reasoning, calls)


def _join(a: ParsedDelta, b: ParsedDelta) -> ParsedDelta:
    return ParsedDelta(a.content + b.content, a.reasoning + b.reasoning, a.tool_calls + b.tool_calls)


def parse_harmony(
    encoding: HarmonyEncoding, token_ids: Sequence[int], request_id: str | None = None, calls: bool = True
) -> ParsedOutput:
    """A whole output's channels (the streamed deltas joined)."""
    p = HarmonyParser(encoding, request_id, calls)
    d = _join(p.feed(token_ids), p.finish())
    calls = [ToolCall(c.id, c.name, c.arguments_delta) for c in d.tool_calls]
    return ParsedOutput(d.content, d.reasoning, calls)
