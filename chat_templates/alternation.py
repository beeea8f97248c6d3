"""Conversations fitted to templates that require strictly alternating user/assistant turns.

Gemma's (and Mistral's, Llama 2's) template raises "Conversation roles must alternate
user/assistant/user/assistant/..." for anything else, and takes a system message only as the first.
Agents send what the OpenAI and Anthropic APIs allow: Codex CLI opens with two developer messages and
two user messages, tool results follow tool calls.  Like llama.cpp's template polyfills (minja's
``supports_system_role`` / ``polyfill_tool_responses`` / ``polyfill_tool_calls``), such a conversation
is rewritten before rendering, never refused:

- the leading system messages become one system message of text (joined by a blank line: Gemma's
  template reads only the first part of a system message's content list);
- a later system message, and a tool result, becomes a user turn (a tool result as its text);
- an assistant turn's tool calls, where the template renders none, are written into its text as JSON
  (``{"tool_calls": [...]}``), so the history still says what was called;
- consecutive turns of one role are merged into one turn (text joined by a blank line).

Invariant (checked by ``alternates``): after the optional system message, roles alternate between
user and assistant.  A conversation that starts with an assistant turn still does not (nothing here
invents a user turn); the template refuses it with its own message.
"""

from __future__ import annotations

import json
from typing import Any

ALTERNATION_MARK = "roles must alternate"
JOIN = "\n\n"


def requires_alternation(source: str) -> bool:
    """The template refuses non-alternating roles (the error text the HF templates use for it)."""
    return ALTERNATION_MARK in source.lower()


def _text(content: Any) -> str | None:
    """The content as one string where it is text only; None where it has other parts (images)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return JOIN.join(str(p.get("text", "")) for p in content)
    return None


def _parts(content: Any) -> list:
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": "" if content is None else str(content)}]


def _joined(a: Any, b: Any) -> Any:
    ta, tb = _text(a), _text(b)
    if ta is not None and tb is not None:
        return JOIN.join(t for t in (ta, tb) if t)
    return _parts(a) + [{"type": "text", "text": JOIN}] + _parts(b)


def _arguments(args: Any) -> Any:
    """A call's arguments as the object they encode (OpenAI sends a JSON string), else as given."""
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


def _calls_as_text(message: dict) -> dict:
    calls = [
        {
            "name": (c.get("function") or {}).get("name"),
            "arguments": _arguments((c.get("function") or {}).get("arguments")),
        }
        for c in message.get("tool_calls") or []
    ]
    text = json.dumps({"tool_calls": calls}, ensure_ascii=False)
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    out["content"] = _joined(message.get("content"), text)
    return out


def alternate(messages: list[dict], source: str) -> list[dict]:
    """``messages`` rewritten so a template requiring alternation renders them (see the module doc);
    unchanged (the same list) where they already alternate."""
    if alternates(messages):
        return messages
    renders_calls = "tool_calls" in source
    head: list[dict] = []
    rest = list(messages)
    while rest and rest[0].get("role") in ("system", "developer"):
        m = rest.pop(0)
        head = [
            {"role": "system", "content": _joined(head[0]["content"] if head else None, m.get("content"))}
        ]
    out: list[dict] = []
    for m in rest:
        role = m.get("role")
        if role in ("system", "developer", "tool"):
            m = {"role": "user", "content": m.get("content")}
        elif role == "assistant" and m.get("tool_calls") and not renders_calls:
            m = _calls_as_text(m)
        if out and out[-1]["role"] == m["role"]:
            prev = out[-1]
            merged = {**prev, **{k: v for k, v in m.items() if k != "content"}}
            if prev.get("tool_calls") and m.get("tool_calls"):
                merged["tool_calls"] = [*prev["tool_calls"], *m["tool_calls"]]
            merged["content"] = _joined(prev.get("content"), m.get("content"))
            out[-1] = merged
        else:
            out.append(dict(m))
    return head + out


def alternates(messages: list[dict]) -> bool:
    """After at most one leading system message: user, assistant, user, ... (no tool or later system)."""
    body = messages[1:] if messages and messages[0].get("role") == "system" else messages
    if (
        body is not messages
        and isinstance(messages[0].get("content"), list)
        and len(messages[0]["content"]) > 1
    ):
        return False  # Gemma's template reads only a list system message's first part
    return all(m.get("role") == ("user" if i % 2 == 0 else "assistant") for i, m in enumerate(body))
