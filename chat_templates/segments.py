"""Attribute spans of a rendered prompt to messages, tool definitions, think blocks and glue.

Method: render once more with every message string (content, reasoning, tool-call names and string
arguments, tool descriptions) wrapped in invisible private-use markers, then strip the markers; if
the stripped text equals the real rendering, the marker positions are exact.  Why this way:

* one extra render, linear in the conversation -- rendering every prefix of the message list would
  be quadratic, and gives wrong boundaries for exactly the templates we need to diagnose (the ones
  that are not append-only) or raises on partial conversations (templates that require a user turn);
* markers sit inside the string's surrounding whitespace, so templates that ``strip``/``trim`` or
  split on ``</think>`` still produce the same text; a marker the template drops only narrows a span;
* the equality check makes it safe: a template that inspects the strings in a way markers disturb
  (``startswith``, length tests) is detected, and we fall back to an in-order text search.
"""

from __future__ import annotations

import bisect
import copy
import heapq
import re
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any

_OPEN, _CLOSE = "\ue000", "\ue001"
_MARK_RE = re.compile(f"{_OPEN}([mt])(\\d+){_CLOSE}")
_MARKED_CORE_RE = re.compile(f"{_OPEN}[mt]{_CLOSE}(.*?){_OPEN}[mt]{_CLOSE}", re.DOTALL)
_TAG_RE = re.compile(r"(</?think>)")
_THINK_RE = re.compile(r"<think>.*?(?:</think>\s*|$)", re.DOTALL)
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
_PRIORITY = {"think": 3, "message": 2, "system": 2, "tools": 2, "generation_prompt": 1}

Span = tuple[str, int | None, int, int]
TextOf = Callable[[Sequence[dict], "list[dict] | None", bool], str]


def _mark(s: Any, tag: str) -> Any:
    if not isinstance(s, str):
        return s
    # Pieces between think tags are marked separately, so templates that split content on
    # ``</think>`` (Qwen3) keep a marker on both the reasoning and the answer.
    return "".join(p if _TAG_RE.fullmatch(p) else _mark_piece(p, tag) for p in _TAG_RE.split(s))


def _mark_piece(s: str, tag: str) -> str:
    core = s.strip()
    if not core:
        return s
    lead = s[: len(s) - len(s.lstrip())]
    trail = s[len(s.rstrip()) :]
    m = f"{_OPEN}{tag}{_CLOSE}"
    return f"{lead}{m}{core}{m}{trail}"


def _marked_message(msg: dict, tag: str) -> dict:
    msg = copy.deepcopy(msg)
    content = msg.get("content")
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and "text" in part:
                part["text"] = _mark(part["text"], tag)
    else:
        msg["content"] = _mark(content, tag)
    for key in _REASONING_KEYS:
        if key in msg:
            msg[key] = _mark(msg[key], tag)
    for call in msg.get("tool_calls") or []:
        fn = call.get("function", call) if isinstance(call, dict) else None
        if isinstance(fn, dict):
            fn["name"] = _mark(fn.get("name"), tag)
            fn["arguments"] = _mark(fn.get("arguments"), tag)
    return msg


def _marked_tool(tool: dict, tag: str) -> dict:
    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: _mark(v, tag) if k in ("name", "description") else walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(x) for x in node]
        return node

    return walk(tool)


def _strip_marks(marked: str) -> tuple[str, list[tuple[int, str, int]]]:
    points: list[tuple[int, str, int]] = []
    out: list[str] = []
    last = removed = 0
    for m in _MARK_RE.finditer(marked):
        out.append(marked[last : m.start()])
        points.append((m.start() - removed, m.group(1), int(m.group(2))))
        removed += m.end() - m.start()
        last = m.end()
    out.append(marked[last:])
    return "".join(out), points


def _search_points(text: str, messages: list[dict], tools: list[dict] | None) -> list[tuple[int, str, int]]:
    """Fallback: find each item's marked strings, in order, in the real text (approximate but safe)."""
    points: list[tuple[int, str, int]] = []
    groups = (
        ("t", [_marked_tool(t, "t") for t in tools or []]),
        ("m", [_marked_message(m, "m") for m in messages]),
    )
    for kind, items in groups:
        cursor = 0
        for i, item in enumerate(items):
            for core in (c for v in _strings(item) for c in _MARKED_CORE_RE.findall(v)):
                pos = text.find(core, cursor)
                if pos >= 0:
                    points += [(pos, kind, i), (pos + len(core), kind, i)]
                    cursor = pos + len(core)
    return points


def _strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for v in node.values() for s in _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return []


def find_segments(
    text: str,
    messages: list[dict],
    tools: list[dict] | None,
    text_of: TextOf,
    add_generation_prompt: bool,
) -> list[Span]:
    """Segments ``(kind, message_index, char_start, char_end)`` covering ``text`` in order."""
    marked_msgs = [_marked_message(m, f"m{i}") for i, m in enumerate(messages)]
    marked_tools = [_marked_tool(t, f"t{i}") for i, t in enumerate(tools)] if tools else tools
    try:
        clean, points = _strip_marks(text_of(marked_msgs, marked_tools, add_generation_prompt))
    except Exception:  # a template may reject marked input; the fallback below still works
        clean, points = "", []
    if clean != text:
        points = _search_points(text, messages, tools)

    claims: list[Span] = []
    regions: dict[tuple[str, int], list[int]] = {}
    for pos, kind, idx in points:
        regions.setdefault((kind, idx), []).append(pos)
    for (kind, idx), positions in regions.items():
        if kind == "t":
            claims.append(("tools", None, min(positions), max(positions)))
        else:
            role_kind = "system" if messages[idx].get("role") == "system" else "message"
            claims.append((role_kind, idx, min(positions), max(positions)))
    msg_claims = sorted(c for c in claims if c[1] is not None)
    # owner of a think block: the first message claim (in that order) ending at or after its start,
    # found by bisecting the running maximum of the claim ends
    reach = list(accumulate((c[3] for c in msg_claims), max))
    for m in _THINK_RE.finditer(text):
        j = bisect.bisect_left(reach, m.start())
        claims.append(("think", msg_claims[j][1] if j < len(reach) else None, m.start(), m.end()))
    if add_generation_prompt:
        bare = text_of(messages, tools, False)
        if text.startswith(bare) and len(bare) < len(text):
            claims.append(("generation_prompt", None, len(bare), len(text)))
    return _paint(text, claims)


def _paint(text: str, claims: list[Span]) -> list[Span]:
    """Resolve overlapping claims by priority (the earliest claim wins a tie); uncovered text is glue.

    A sweep over the boundaries with one heap of open claims per priority, so it is linear-log in
    the number of claims (a claim-by-boundary scan is quadratic in the number of messages).
    """
    claims = [c for c in claims if 0 <= c[2] < c[3] <= len(text)]
    bounds = sorted({0, len(text)} | {c[2] for c in claims} | {c[3] for c in claims})
    by_start = sorted(range(len(claims)), key=lambda j: claims[j][2])
    heaps: dict[int, list[tuple[int, int]]] = {p: [] for p in sorted(set(_PRIORITY.values()), reverse=True)}
    nxt = 0
    spans: list[Span] = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        while nxt < len(by_start) and claims[by_start[nxt]][2] <= lo:
            j = by_start[nxt]
            heapq.heappush(heaps[_PRIORITY[claims[j][0]]], (j, claims[j][3]))
            nxt += 1
        best: tuple[str, int | None] = ("template", None)
        for heap in heaps.values():  # highest priority first
            while heap and heap[0][1] <= lo:  # closed before this piece
                heapq.heappop(heap)
            if heap:
                kind, idx = claims[heap[0][0]][:2]
                best = (kind, idx)
                break
        if spans and spans[-1][:2] == best:
            spans[-1] = (best[0], best[1], spans[-1][2], hi)
        else:
            spans.append((best[0], best[1], lo, hi))
    return spans
