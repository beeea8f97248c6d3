"""Scripted replies: a benchmark mode where the words of each reply are chosen by a script but every
token still goes through the engine, the prefix cache and the chat template (forced decoding).

A tiny or random model does not choose tools, so an agent benchmark on it forces the replies: the
script's next step (a tool call the agent then really runs, or text) is rendered by the server's chat
template as the conversation's next assistant turn, exactly as a model trained on it emits it, and
those token ids are decoded as forced tokens (``SamplingParams.forced_tokens``): their KV is computed
and cached like any generation's.  Figures from this mode are labelled "scripted".

Which requests take a step: the agent's main loop sends its tools, so a request with tools takes the
next step; one without (title generation, a quota probe, a summary) gets the script's ``side`` text.
When the steps run out, every request with tools gets ``done`` (text: the agent ends its turn).
A side request may carry the tools too: Claude Code compacts in a fork that sends the main loop's
very prefix (tools included, for the cache) with one instruction appended ("Respond with TEXT ONLY.
Do NOT call any tools"); the script's ``side_when`` (substrings of the last message's text) names
those, and they get ``side`` without taking a step.

``ModelReplies`` is the null object (the model's own replies); ``ScriptedReplies.load(path)`` reads a
JSON script: ``{"steps": [{"tool": NAME, "input": {...}} | {"text": "..."}, ...], "side": "...",
"done": "...", "side_when": ["..."]}`` (a step may hold several calls: ``{"calls": [{"tool": ..., "input": ...}, ...]}``).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from kvreuse.chat_templates.render import render_text


class ModelReplies:
    """The model's own replies: nothing is forced."""

    name = "model"

    def is_side(self, messages: list[dict]) -> bool:
        """The last message's text holds one of ``side_when`` (a compaction prompt sent with the tools)."""
        if not self.side_when or not messages:
            return False
        text = _text(messages[-1].get("content"))
        return any(marker in text for marker in self.side_when)

    def reply_ids(self, messages: list[dict], tools: list[dict] | None, kwargs: dict, prompt_text: str,
                  tokenizer: Any, source: str, eos_ids: frozenset[int]) -> tuple[list[int], str] | None:  # fmt: skip
        return None


def assistant_message(step: dict[str, Any], index: int) -> dict[str, Any]:
    """The template message of one script step (tool calls as OpenAI-style function calls)."""
    calls = step.get("calls") or ([step] if "tool" in step else [])
    return {
        "role": "assistant",
        "content": step.get("text", ""),
        "tool_calls": [
            {"id": f"call_s{index}_{i}", "type": "function",
             "function": {"name": c["tool"], "arguments": json.dumps(c.get("input", {}))}}
            for i, c in enumerate(calls)
        ] or None,
    }  # fmt: skip


class ScriptedReplies:
    """Replies forced from a script (see the module docstring); thread-safe (requests render in the prep pool)."""

    name = "scripted"

    def __init__(
        self,
        steps: list[dict[str, Any]],
        side: str = "OK",
        done: str = "Done.",
        side_when: tuple[str, ...] = (),
    ) -> None:
        for s in steps:
            if not isinstance(s, dict) or not ({"tool", "text", "calls"} & s.keys()):
                raise ValueError(f"a script step needs 'tool', 'calls' or 'text': {s!r:.80}")
        self.steps, self.side, self.done, self.side_when = steps, side, done, tuple(side_when)
        self.taken = 0  # main-loop steps handed out
        self.side_replies = 0
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str | Path) -> ScriptedReplies:
        return cls.from_dict(json.loads(Path(path).read_text()))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScriptedReplies:
        return cls(d["steps"], d.get("side", "OK"), d.get("done", "Done."), tuple(d.get("side_when", ())))

    def next_step(self, has_tools: bool) -> tuple[dict[str, Any], int]:
        with self._lock:
            if not has_tools:
                self.side_replies += 1
                return {"text": self.side}, -1
            k = self.taken
            self.taken += 1
        return (self.steps[k] if k < len(self.steps) else {"text": self.done}), k

    def is_side(self, messages: list[dict]) -> bool:
        """The last message's text holds one of ``side_when`` (a compaction prompt sent with the tools)."""
        if not self.side_when or not messages:
            return False
        text = _text(messages[-1].get("content"))
        return any(marker in text for marker in self.side_when)

    def reply_ids(self, messages: list[dict], tools: list[dict] | None, kwargs: dict, prompt_text: str,
                  tokenizer: Any, source: str, eos_ids: frozenset[int]) -> tuple[list[int], str] | None:  # fmt: skip
        """The ids of the next reply (the template's rendering of it after ``messages``, to its end of
        turn) and which it was: ``step N``, ``side`` or ``done``."""
        step, k = self.next_step(bool(tools) and not self.is_side(messages))
        reply = assistant_message(step, k)
        done = render_text(tokenizer, [*messages, reply], tools, template=source,
                           add_generation_prompt=False, **kwargs)  # fmt: skip
        # the reply's text: what the whole conversation adds after the prompt (a template that rewrites
        # earlier turns once a reply exists shows up as a longer tail, as it would in a real run)
        n = len(prompt_text) if done.startswith(prompt_text) else _common(done, prompt_text)
        ids = tokenizer.encode(done[n:], add_special_tokens=False)
        end = next((i for i, t in enumerate(ids) if t in eos_ids), None)
        label = "side" if k < 0 else f"step {k}" if k < len(self.steps) else "done"
        return (ids[: end + 1] if end is not None else ids), label


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return ""


def _common(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def replies_from(path: str | None) -> ModelReplies | ScriptedReplies:
    return ModelReplies() if path is None else ScriptedReplies.load(path)
