"""Cache-miss diagnostics: where a chat request's prefix stopped matching what the cache holds, and why.

We keep the last requests (prompt + generated token ids, their messages, tools and segments).  The
earlier request sharing the longest token prefix with a new one is what the radix cache most
likely holds; the first differing token is located in the new rendering (message, tools, think
block, generation prompt) and the two message lists are compared to name a likely cause.

Privacy: the earlier request may be another user's.  Everything a diagnosis shows is the
requester's own prompt (its message, segment, token index and text); of the earlier request it
says only that it differed there, never what it held.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any, NamedTuple

from kvreuse.chat_templates.render import RenderedPrompt, describe, first_divergence, locate
from kvreuse.runtime.engine.outputs import RequestOutput

CONTEXT_TOKENS = 16
CONTEXT_CHARS = 60

CAUSES = (
    "new_conversation",
    "precomputed",
    "append_only",
    "assistant_turn_differs",
    "system_changed",
    "reasoning_effort_changed",
    "tools_reordered",
    "tools_changed",
    "history_truncated",
    "message_edited",
    "template_rerendered",
    "evicted",
)


def cached_by_tier(out: RequestOutput) -> dict[str, Any]:
    """Where a request's cached tokens came from: the pool, or loaded back from the host / disk /
    shared tier (``load_ms``: the engine's time copying them in); pool + host + disk + shared ==
    ``cached_tokens``."""
    host, disk, shared = out.cached_host_tokens, out.cached_disk_tokens, out.cached_shared_tokens
    return {"pool": out.cached_tokens - host - disk - shared, "host": host, "disk": disk, "shared": shared,
            "load_ms": round(out.tier_load_s * 1e3, 3)}  # fmt: skip


class HistoryEntry(NamedTuple):
    """One finished chat request as the cache saw it."""

    token_ids: list[int]  # prompt + generated
    num_prompt: int
    messages: list[dict]
    tools: list[dict] | None
    options: dict[str, Any] = {}  # the template variables it was rendered with (e.g. reasoning_effort)


def _canon(x: Any) -> str:
    return json.dumps(x, sort_keys=True, ensure_ascii=False)


def _system(messages: list[dict]) -> str | None:
    return messages[0].get("content") if messages and messages[0].get("role") == "system" else None


def _body(messages: list[dict]) -> list[dict]:
    return messages[1:] if messages and messages[0].get("role") == "system" else messages


class CacheDiagnostics:
    """Bounded history of requests, and the diagnosis of each new one against it."""

    def __init__(self, tokenizer: Any, page_size: int, max_entries: int = 64) -> None:
        self.tokenizer = tokenizer
        self.page_size = page_size
        self.history: deque[HistoryEntry] = deque(maxlen=max_entries)

    def record(self, entry: HistoryEntry) -> None:
        self.history.append(entry)

    def best_match(self, token_ids: list[int]) -> tuple[HistoryEntry | None, int]:
        best, best_len = None, 0
        for entry in reversed(self.history):  # the most recent wins a tie
            n = first_divergence(entry.token_ids, token_ids)
            if n > best_len:
                best, best_len = entry, n
        return best, best_len

    def diagnose(
        self,
        rendered: RenderedPrompt,
        messages: list[dict],
        tools: list[dict] | None,
        prompt_ids: list[int],
        cached_tokens: int,
        snapshot_cut: int = 0,
        options: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The ``kvreuse.cache`` object of a response (``snapshot_cut``: see ``Request.snapshot_cut``)."""
        entry, common = self.best_match(prompt_ids)
        out: dict[str, Any] = {
            "prompt_tokens": len(prompt_ids),
            "cached_tokens": cached_tokens,
            "reusable_tokens": common,
            "cause": "new_conversation",
            "detail": "no earlier request shares a prefix with this one",
            "divergence": None,
        }
        if cached_tokens > common + self.page_size:
            # more was cached than any remembered request computed: a replica that only sees its own
            # requests would otherwise call a shared-tier hit a new conversation
            out["cause"], out["detail"] = (
                "precomputed",
                (
                    f"{cached_tokens} tokens were cached though no earlier request this server remembers shares more than "
                    f"{common}: pages read from the shared tier (another replica computed them), the disk tier, or a prewarm"
                ),
            )
            return out
        if entry is None:
            return out
        if common < len(prompt_ids) and common < len(entry.token_ids):
            out["divergence"] = self._divergence(rendered, messages, entry, prompt_ids, common)
        out["cause"], out["detail"] = self._cause(
            entry, messages, tools, common, cached_tokens, out["divergence"], options or {}
        )
        if snapshot_cut and common <= cached_tokens + snapshot_cut + self.page_size:
            out["snapshot_cut_tokens"] = snapshot_cut
            out["cause"], out["detail"] = (
                "snapshot_cut",
                (
                    f"the KV pages matched {cached_tokens + snapshot_cut} tokens but the last state snapshot "
                    f"(linear-attention state or sliding-window keys) ended at {cached_tokens}: {snapshot_cut} tokens were recomputed "
                    "(raise --snapshot-memory, or --snapshot-every for snapshots inside long prompts)"
                ),
            )
        return out

    def _divergence(
        self, rendered: RenderedPrompt, messages: list[dict], entry: HistoryEntry, ids: list[int], at: int
    ) -> dict[str, Any]:
        seg = locate(rendered, at) if at < len(rendered.token_ids) else None
        index = seg.message_index if seg else None
        where = describe(seg, messages) if seg else "forced tool-call prefix"
        if seg is not None and seg.kind == "template":
            # Glue (role headers, separators) is attributed to the message it introduces.
            nxt = next(
                (
                    s
                    for s in rendered.segments
                    if s.char_start >= seg.char_end and s.message_index is not None
                ),
                None,
            )
            if nxt is not None:
                index, where = (
                    nxt.message_index,
                    f"template glue before {describe(nxt, messages)}",
                )
        dec = self.tokenizer.decode
        return {
            "token_index": at,
            "message_index": index,
            "segment": seg.kind if seg else "generation_prompt",
            "where": where,
            "in_generated_part": at >= entry.num_prompt,
            # only this request's own tokens: what the earlier request had here is not ours to show
            "before_text": dec(ids[max(0, at - CONTEXT_TOKENS) : at])[-CONTEXT_CHARS:],
            "new_text": dec(ids[at : at + CONTEXT_TOKENS])[:CONTEXT_CHARS],
            "earlier_request": "differed from this token on",
        }

    def _cause(
        self,
        entry: HistoryEntry,
        messages: list[dict],
        tools: list[dict] | None,
        common: int,
        cached: int,
        div: dict[str, Any] | None,
        options: dict[str, Any],
    ) -> tuple[str, str]:
        if common > cached + self.page_size:
            return "evicted", (
                f"an earlier request shared {common} tokens but only {cached} were still cached: "
                "its pages were evicted (raise --kv-cache-memory or send fewer concurrent conversations)"
            )
        if div is None:
            return "append_only", "the prompt extends an earlier request; everything reusable was reused"
        old, new = entry.messages, messages
        if not set(map(_canon, old)) & set(map(_canon, new)):
            return "new_conversation", "no message in common with the closest earlier request"
        old_effort, new_effort = entry.options.get("reasoning_effort"), options.get("reasoning_effort")
        if old_effort != new_effort:  # it sits in the system message, before everything else
            return "reasoning_effort_changed", (
                f"the reasoning effort changed ({old_effort or 'default'} -> {new_effort or 'default'}); it is "
                "written into the system message, so everything after it is recomputed: keep it constant"
            )
        old_tools, new_tools = entry.tools or [], tools or []
        if _canon(old_tools) != _canon(new_tools) and div["segment"] in ("tools", "template", "system"):
            if sorted(map(_canon, old_tools)) == sorted(map(_canon, new_tools)):
                return (
                    "tools_reordered",
                    "same tool definitions in a different order: keep tools in a fixed order",
                )
            return "tools_changed", "tool definitions changed, so everything after them is recomputed"
        if _system(old) is not None and _system(new) is not None and _system(old) != _system(new):
            a, b = _system(old), _system(new)
            at = first_divergence(a, b)
            return "system_changed", (
                f"the system message differs from an earlier request's from char {at} on (here: "
                f"{b[at : at + 20]!r}), e.g. a timestamp: keep the system prompt constant"
            )
        old_body, new_body = _body(old), _body(new)
        if new_body:
            first = _canon(new_body[0])
            starts = [j for j, m in enumerate(old_body) if _canon(m) == first]
            if (
                starts
                and starts[0] > 0
                and _canon(old_body[starts[0] :]) == _canon(new_body[: len(old_body) - starts[0]])
            ):
                return "history_truncated", (
                    f"the first {starts[0]} earlier message(s) were removed (sliding window): "
                    "everything after the removal point is recomputed"
                )
        if div["in_generated_part"]:
            return "assistant_turn_differs", (
                "the assistant message in the history renders differently from the tokens the model generated "
                "(edited reply, dropped reasoning, or reformatted tool call); only that turn onwards is recomputed"
            )
        shared = min(len(old), len(new))
        edited = next((i for i in range(shared) if _canon(old[i]) != _canon(new[i])), None)
        if edited is not None:
            return (
                "message_edited",
                f"message {edited} ({new[edited].get('role')}) differs from the earlier request",
            )
        return "template_rerendered", (
            "the messages are the same but the template rendered earlier turns differently "
            "(e.g. reasoning dropped from past assistant turns)"
        )
