"""Recent requests, per tenant, for the live page (``/ui``): a bounded ring of what each finished
request cost (cached by tier, prefilled, generated, TTFT) and, for chat requests, where its prefix
broke: the cause, the two texts at the break point, the message it happened in.

A tenant's ring holds only its own requests, and a break's earlier text comes from the same
tenant's diagnostics history (``ServerState.diagnostics_for``), so nothing here crosses tenants.
``NoActivity`` is the same surface when the page is off (``--no-ui``): it keeps and computes nothing.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any, Protocol

from kvreuse.runtime.engine.outputs import RequestOutput
from kvreuse.runtime.server.diagnostics import CONTEXT_CHARS, CONTEXT_TOKENS, CacheDiagnostics, cached_by_tier

MESSAGE_CHARS = 600  # of the message a break happened in, shown around the break


class FinishedRun(Protocol):
    """What a record reads off a finished run (``core.run.EngineRun``)."""

    id: str
    n: int
    prompts: list[list[int]]
    session: str | None
    details: dict[str, Any]
    scope: Any


def _message_text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts: the text ones
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not content and message.get("tool_calls"):
        calls = message["tool_calls"]
        content = " ".join(f"{c['function']['name']}({c['function']['arguments']})" for c in calls)
    return str(content or "")


def break_detail(
    diagnostics: CacheDiagnostics, prompt_ids: list[int], messages: list[dict], diag: dict[str, Any]
) -> dict[str, Any]:
    """The page's view of a break (call before the request joins the history): the earlier request's
    text after the break point beside this one's, and the message the break is in."""
    div = diag.get("divergence")
    if not div:
        return {}
    entry, common = diagnostics.best_match(prompt_ids)
    at = div["token_index"]
    earlier = ""
    if entry is not None and common == at:
        earlier = diagnostics.tokenizer.decode(entry.token_ids[at : at + CONTEXT_TOKENS])[:CONTEXT_CHARS]
    out: dict[str, Any] = {"earlier_text": earlier, "message": None}
    index = div.get("message_index")
    if index is not None and 0 <= index < len(messages):
        m = messages[index]
        out["message"] = {"index": index, "role": m.get("role"), "text": _message_text(m)[:MESSAGE_CHARS]}
    return out


def request_record(seq: int, run: FinishedRun, outs: list[RequestOutput], now: float) -> dict[str, Any]:
    """One finished request as the page shows it; token figures as the API's usage counts them (each
    prompt's cached tokens are its first choice's)."""
    firsts = outs[:: run.n]
    tiers = [cached_by_tier(o) for o in firsts]
    prompt = sum(len(p) for p in run.prompts)
    cached = sum(int(o.cached_tokens or 0) for o in firsts)
    ttfts = [o.ttft_s for o in outs if o.ttft_s is not None]
    return {
        "seq": seq,
        "id": run.id,
        "time": now,
        "session": run.session,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_by_tier": {k: sum(t[k] for t in tiers) for k in ("pool", "host", "disk", "shared")},
        "prefilled_tokens": prompt - cached,
        "generated_tokens": sum(len(o.output_token_ids) for o in outs),
        "ttft_s": min(ttfts) if ttfts else None,
        "finish_reason": outs[0].finish_reason if outs else None,
        "cache": run.details.get("cache"),
        "break": run.details.get("break") or None,
    }


class RecentRequests:
    """The last ``per_tenant`` finished requests of each tenant, newest last; ``seq`` orders them
    server-wide so a page asks only for what it has not seen."""

    def __init__(self, per_tenant: int = 200) -> None:
        if per_tenant < 1:
            raise ValueError(f"the page's request history must hold >= 1 request, got {per_tenant}")
        self.per_tenant = per_tenant
        self._rings: dict[Any, deque[dict[str, Any]]] = {}
        self._seq = itertools.count(1)

    def break_detail(
        self, diagnostics: CacheDiagnostics, prompt_ids: list[int], messages: list[dict], diag: dict
    ) -> dict[str, Any]:
        return break_detail(diagnostics, prompt_ids, messages, diag)

    def record(self, run: FinishedRun, outs: list[RequestOutput], now: float) -> None:
        ring = self._rings.setdefault(run.scope.namespace, deque(maxlen=self.per_tenant))
        ring.append(request_record(next(self._seq), run, outs, now))

    def since(self, tenant: Any, after: int = 0) -> list[dict[str, Any]]:
        """The tenant's records with ``seq > after``, oldest first."""
        return [r for r in self._rings.get(tenant, ()) if r["seq"] > after]

    def clear(self) -> None:
        self._rings.clear()


class NoActivity(RecentRequests):
    """The page is off: nothing recorded, no break detail computed."""

    def __init__(self) -> None:
        super().__init__(1)

    def break_detail(self, *_: Any) -> dict[str, Any]:
        return {}

    def record(self, *_: Any) -> None:
        return None
