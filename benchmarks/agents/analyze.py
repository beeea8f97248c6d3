"""Per request and per agent: what the server's cache made of a recorded agent session.

``ideal_cached`` of a request is the previous main-loop request's whole sequence (prompt + reply; the
reply's last token never ran through the model, hence -1), in whole pages, where the new prompt could
extend it (capped at the prompt less one token): what an append-only agent on an exact cache reuses.
The first request and side requests (no tools: a summary, a title) have the server's own bound, the
longest prefix any earlier sequence shares (``reusable_tokens``) in whole pages.  ``deficit`` =
ideal - cached; every deficit over one page carries the server's diagnosis of the break (cause,
where, detail: ``runtime/server/diagnostics.py``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

CHAT_PATHS = ("/v1/messages", "/v1/responses", "/v1/chat/completions")


def chat_records(records: list[dict]) -> list[dict]:
    return [r for r in records if r["method"] == "POST" and r["path"] in CHAT_PATHS and r["status"] == 200]


def output_tokens(rec: dict) -> int:
    u = rec["result"].get("usage") or {}
    return int(u.get("output_tokens", u.get("completion_tokens", 0)) or 0)


def rows(records: list[dict], page: int) -> list[dict[str, Any]]:
    out, prev_seq = [], None
    for rec in chat_records(records):
        ext = rec["result"].get("kvreuse") or {}
        cache = ext.get("cache") or {}
        prompt, cached = cache.get("prompt_tokens", 0), cache.get("cached_tokens", 0)
        label = ext.get("scripted") or "model"
        side = label == "side"
        bound = cache.get("reusable_tokens", 0) // page * page
        if side or prev_seq is None:
            ideal = bound
        else:
            ideal = min(prev_seq - 1, prompt - 1) // page * page
        div = cache.get("divergence") or {}
        row = {"seq": rec["seq"], "path": rec["path"], "kind": "side" if side else "main", "reply": label,
               "prompt_tokens": prompt, "cached_tokens": cached, "ideal_cached": ideal,
               "deficit": ideal - cached, "output_tokens": output_tokens(rec), "cause": cache.get("cause"),
               "where": div.get("where"), "detail": cache.get("detail"),
               "before_text": div.get("before_text"), "new_text": div.get("new_text")}  # fmt: skip
        out.append(row)
        if not side:
            prev_seq = prompt + row["output_tokens"]
    return out


def summary(session: dict[str, Any], page: int) -> dict[str, Any]:
    """The per-agent figures of the report."""
    rs = rows(session["records"], page)
    prompt = sum(r["prompt_tokens"] for r in rs)
    cached = sum(r["cached_tokens"] for r in rs)
    ideal = sum(r["ideal_cached"] for r in rs)
    breaks = [r for r in rs if r["deficit"] > page]
    other = Counter(
        f"{r['method']} {r['path']}" for r in session["records"] if r not in chat_records(session["records"])
    )
    return {
        "agent": session["agent"], "scripted": True, "http_requests": len(session["records"]),
        "model_requests": len(rs), "main_requests": sum(r["kind"] == "main" for r in rs),
        "side_requests": [{"seq": r["seq"], "prompt_tokens": r["prompt_tokens"], "why": r["cause"]}
                          for r in rs if r["kind"] == "side"],
        "other_http": dict(other), "prompt_tokens": prompt, "cached_tokens": cached, "ideal_cached": ideal,
        "cached_share": cached / max(1, prompt), "ideal_share": ideal / max(1, prompt),
        "deficit_tokens": ideal - cached, "breaks_over_a_page": len(breaks),
        "unexplained_breaks": sum(1 for r in breaks if not r["cause"] or r["cause"] in ("append_only", "precomputed")),
        "break_causes": dict(Counter(r["cause"] for r in breaks)),
        "runs": [{k: v for k, v in run.items() if k != "output_tail"} for run in session["runs"]],
        "rows": rs,
    }  # fmt: skip
