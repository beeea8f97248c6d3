"""A recorded agent session replayed against a running server (``--server URL``): each recorded model
request's body is sent again, verbatim, to the path the agent used (``/v1/messages``,
``/v1/responses``), in order, with the prefix cache on and then off (``POST /v1/cache/reset`` before
every request, as ``ServerTarget`` of the pattern benchmark does).

The prompts are the agent's own, whatever the server; the replies are the server's.  A kvreuse
server started with the session's script (``--script``, ``write_script``), its model and template
gives the live session's replies, so cache on must find the live cached tokens request by request
(``matches_live``); another server's replies differ, and only what its cache makes of the same
prompts is comparable.  Cached tokens are read from each protocol's own usage
(``cache_read_input_tokens``; ``input_tokens_details.cached_tokens``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvreuse.benchmarks.agents.analyze import chat_records
from kvreuse.runtime.server.recorder import final_figures


def write_script(session: dict[str, Any], path: Path) -> Path:
    """The session's script as the server's ``--script`` file."""
    path.write_text(json.dumps(session["script"]))
    return path


def usage_counts(path: str, usage: dict[str, Any]) -> tuple[int, int]:
    """(prompt tokens, cached tokens) from one protocol's usage object."""
    if path == "/v1/messages":
        cached = int(usage.get("cache_read_input_tokens") or 0)
        prompt = (
            int(usage.get("input_tokens") or 0) + cached + int(usage.get("cache_creation_input_tokens") or 0)
        )
        return prompt, cached
    details = usage.get("input_tokens_details") or usage.get("prompt_tokens_details") or {}
    prompt = int(usage.get("input_tokens", usage.get("prompt_tokens", 0)) or 0)
    return prompt, int(details.get("cached_tokens") or 0)


def replay_server(session: dict[str, Any], url: str, api_key: str = "sk-local", timeout_s: float = 600.0) -> dict[str, Any]:  # fmt: skip
    """Prompt and cached tokens per request, cache on and off, from the server at ``url``."""
    import httpx

    base = url.rstrip("/").removesuffix("/v1")
    headers = {"authorization": f"Bearer {api_key}", "x-api-key": api_key, "anthropic-version": "2023-06-01"}
    out: dict[str, Any] = {"server": base}
    with httpx.Client(timeout=timeout_s, headers=headers) as http:
        for mode, cache in (("cache_on", True), ("cache_off", False)):
            reset = http.post(f"{base}/v1/cache/reset", json={})
            if reset.status_code >= 400:
                out["reset_note"] = f"POST /v1/cache/reset answered {reset.status_code}: runs may start warm"
            rows = []
            for rec in chat_records(session["records"]):
                if not cache:
                    http.post(f"{base}/v1/cache/reset", json={})
                r = http.post(f"{base}{rec['path']}", json=rec["request"])
                fig = final_figures(r.content)
                prompt, cached = usage_counts(rec["path"], fig.get("usage") or {})
                live = (rec["result"].get("kvreuse") or {}).get("cache") or {}
                rows.append({"seq": rec["seq"], "status": r.status_code, "prompt_tokens": prompt,
                             "cached_tokens": cached, "prefilled_tokens": prompt - cached,
                             "matches_live": (prompt, cached) == (live.get("prompt_tokens"), live.get("cached_tokens"))
                             if cache else prompt == live.get("prompt_tokens")})  # fmt: skip
            out[mode] = {"rows": rows, "prefilled_tokens": sum(r["prefilled_tokens"] for r in rows),
                         "cached_tokens": sum(r["cached_tokens"] for r in rows),
                         "matches_live": sum(r["matches_live"] for r in rows),
                         "errors": sum(r["status"] >= 400 for r in rows)}  # fmt: skip
    on, off = out["cache_on"]["prefilled_tokens"], out["cache_off"]["prefilled_tokens"]
    out["savings_vs_naive"] = 1 - on / max(1, off)
    return out
