"""Streaming-safe parsing of model output into content, reasoning and tool calls.

The parser is a small state machine over a buffer.  Whatever could still turn into markup (a
partial ``<too`` at the end of a chunk, an unclosed ``<tool_call>`` body, a Llama 3 message that
starts with ``{``) is held back until it resolves, so no markup reaches ``content`` at any chunk
boundary, and the concatenated deltas are the same however the output is split.  Malformed tool
markup is returned as plain content: never lost, never an exception.
"""

from __future__ import annotations

from kvreuse.chat_templates.tool_calls import (
    CallIds,
    ParsedDelta,
    ParsedOutput,
    ToolCall,
    ToolCallDelta,
    parse_hermes_body,
    parse_llama3_calls,
    parse_qwen_xml_body,
)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
TOOL_FORMATS = ("hermes", "qwen_xml", "llama3")  # qwen_xml: Qwen3.5's <tool_call><function=...>


class OutputParser:
    """Incremental parser for one request's output; ``feed`` each text delta, then ``finish``."""

    def __init__(
        self,
        tool_format: str | None = None,
        reasoning: bool = False,
        think_open_in_prompt: bool = False,
        request_id: str | None = None,
    ) -> None:
        if tool_format not in (None, *TOOL_FORMATS):
            raise ValueError(
                f"unknown tool format {tool_format!r}; expected one of {', '.join(TOOL_FORMATS)}"
            )
        self._format = tool_format
        self._ids = CallIds(request_id)
        self._buf = ""
        self._mode = "think" if reasoning and think_open_in_prompt else "text"
        if tool_format == "llama3" and self._mode == "text":
            self._mode = "start"  # a Llama 3 tool call is the whole message: decide on its first char
        self._text_tags = [THINK_OPEN, THINK_CLOSE] if reasoning else []
        if tool_format in ("hermes", "qwen_xml"):
            self._text_tags += [CALL_OPEN, CALL_CLOSE]
        elif tool_format == "llama3":
            self._text_tags.append(PYTHON_TAG)
        self._n_calls = 0
        self._content_ws = ""  # trailing whitespace held back: it is dropped if a tool call follows
        self._call_ws = ""  # ...but restored if that tool call turns out malformed
        self._strip_content = False
        self._reasoning_ws = ""
        self._strip_reasoning = self._mode == "think"
        self._out: ParsedDelta = ParsedDelta("", "", [])

    # -- public API ---------------------------------------------------------------------------
    def feed(self, text_delta: str) -> ParsedDelta:
        """Parse one chunk; returns only what is certain so far."""
        self._buf += text_delta
        return self._run(final=False)

    def finish(self) -> ParsedDelta:
        """Flush everything held back (unclosed markup becomes content)."""
        delta = self._run(final=True)
        if self._content_ws and self._n_calls == 0:
            delta = delta._replace(content=delta.content + self._content_ws)
        self._content_ws = ""
        return delta

    # -- emission -----------------------------------------------------------------------------
    def _content(self, s: str) -> None:
        if self._strip_content:
            s = s.lstrip()
            if not s:
                return
            self._strip_content = False
        s = self._content_ws + s
        core = s.rstrip()
        self._content_ws = s[len(core) :]
        if core:
            self._out = self._out._replace(content=self._out.content + core)

    def _reasoning(self, s: str) -> None:
        if self._strip_reasoning:
            s = s.lstrip()
            if not s:
                return
            self._strip_reasoning = False
        s = self._reasoning_ws + s
        core = s.rstrip()
        self._reasoning_ws = s[len(core) :]
        if core:
            self._out = self._out._replace(reasoning=self._out.reasoning + core)

    def _call(self, name: str, arguments: str) -> None:
        self._content_ws = ""
        delta = ToolCallDelta(self._n_calls, self._ids(self._n_calls), name, arguments)
        self._out.tool_calls.append(delta)
        self._n_calls += 1
        self._strip_content = True

    # -- state machine --------------------------------------------------------------------------
    def _run(self, final: bool) -> ParsedDelta:
        self._out = ParsedDelta("", "", [])
        step = {"text": self._step_text, "think": self._step_think, "tool": self._step_tool}
        step |= {"start": self._step_start, "llama": self._step_llama}
        while step[self._mode](final):
            pass
        return self._out

    def _step_text(self, final: bool) -> bool:
        found = _earliest(self._buf, self._text_tags)
        if found is None:
            keep = 0 if final else _partial_suffix(self._buf, self._text_tags)
            self._content(self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        pos, tag = found
        self._content(self._buf[:pos])
        self._buf = self._buf[pos + len(tag) :]
        if tag == THINK_OPEN:
            self._mode, self._strip_reasoning = "think", True
        elif tag == CALL_OPEN:
            self._call_ws, self._content_ws, self._mode = self._content_ws, "", "tool"
        elif tag == PYTHON_TAG:
            self._call_ws, self._content_ws, self._mode = self._content_ws, "", "llama"
            self._buf = PYTHON_TAG + self._buf
        else:  # a stray closing tag carries nothing: drop it rather than leak markup
            self._strip_content = True
        return True

    def _step_think(self, final: bool) -> bool:
        pos = self._buf.find(THINK_CLOSE)
        if pos < 0:
            keep = 0 if final else _partial_suffix(self._buf, [THINK_CLOSE])
            self._reasoning(self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        self._reasoning(self._buf[:pos])
        self._reasoning_ws = ""
        self._buf = self._buf[pos + len(THINK_CLOSE) :]
        self._mode, self._strip_content = "text", True
        return True

    def _step_tool(self, final: bool) -> bool:
        # A closing tag inside a JSON string is text: the call ends at the first one after which
        # the body parses; until one does, wait for more (or, at the end, it is malformed).
        pos = self._buf.find(CALL_CLOSE)
        while pos >= 0 and parse_hermes_body(self._buf[:pos]) is None:
            pos = self._buf.find(CALL_CLOSE, pos + 1)
        if pos < 0 and not final:
            return False
        if pos < 0 and CALL_CLOSE in self._buf:
            pos = self._buf.find(CALL_CLOSE)  # malformed either way: keep the text as written
        body = self._buf if pos < 0 else self._buf[:pos]
        self._buf = "" if pos < 0 else self._buf[pos + len(CALL_CLOSE) :]
        call = parse_qwen_xml_body(body) if self._format == "qwen_xml" else parse_hermes_body(body)
        if call is not None:
            self._call(*call)
        else:
            self._content(self._call_ws + CALL_OPEN + body + ("" if pos < 0 else CALL_CLOSE))
        self._mode = "text"
        return True

    def _step_start(self, final: bool) -> bool:
        head = self._buf.lstrip()
        if head.startswith("{"):
            self._mode = "llama"
        elif not final and (not head or PYTHON_TAG.startswith(head)):
            return False
        else:
            self._mode = "text"
        return True

    def _step_llama(self, final: bool) -> bool:
        if not final:
            return False
        body, self._buf = self._buf, ""
        self._mode = "text"
        calls = parse_llama3_calls(body.strip().removeprefix(PYTHON_TAG))
        if calls is None:
            self._content(self._call_ws + body)
        else:
            for name, arguments in calls:
                self._call(name, arguments)
        return False


def _earliest(buf: str, tags: list[str]) -> tuple[int, str] | None:
    hits = [(buf.find(t), t) for t in tags if t in buf]
    return min(hits) if hits else None


def _partial_suffix(buf: str, tags: list[str]) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of a tag (held back)."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(buf)), best, -1):
            if buf.endswith(tag[:k]):
                best = k
                break
    return best


def parse_full(
    text: str,
    tool_format: str | None = None,
    reasoning: bool = False,
    think_open_in_prompt: bool = False,
    request_id: str | None = None,
) -> ParsedOutput:
    """Parse a whole output at once; identical to streaming it through :class:`OutputParser`."""
    parser = OutputParser(tool_format, reasoning, think_open_in_prompt, request_id)
    return collect([parser.feed(text), parser.finish()])


def collect(deltas: list[ParsedDelta]) -> ParsedOutput:
    """Join streamed deltas into the whole parsed output."""
    calls = [ToolCall(d.id, d.name, d.arguments_delta) for delta in deltas for d in delta.tool_calls]
    return ParsedOutput(
        "".join(d.content for d in deltas),
        "".join(d.reasoning for d in deltas),
        calls,
    )
