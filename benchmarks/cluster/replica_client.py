"""The client side of the replicas benchmark (``benchmarks/cluster/replicas.py``): scripted agent sessions
streamed through a gateway, the replicas' own counters, and the hit-rate summaries."""

from __future__ import annotations

import json
import random
import threading
import time

import httpx

from kvreuse.benchmarks.common import median, percentile, progress
from kvreuse.benchmarks.serving.ttft_multiturn import _text

MODEL = "smol"


def sessions(tokenizer, n: int, turns: int, system_tokens: int, turn_tokens: int) -> list[list[list[dict]]]:
    """Each session's request messages per turn: one shared system prompt, then the session's own
    user / assistant turns (scripted, so every policy sees the same prompts)."""
    system = {"role": "system", "content": _text(random.Random(0), tokenizer, system_tokens)}
    out = []
    for s in range(n):
        rng = random.Random(1000 + s)
        messages = [system]
        per_turn = []
        for t in range(turns):
            if t:
                messages.append({"role": "assistant", "content": _text(rng, tokenizer, turn_tokens // 2)})
            messages.append(
                {"role": "user", "content": f"Session {s}. " + _text(rng, tokenizer, turn_tokens // 2)}
            )
            per_turn.append([dict(m) for m in messages])
        out.append(per_turn)
    return out


def stream(url: str, messages: list[dict], session: int | None = None) -> dict:
    """One streamed chat request: TTFT, usage, the kvreuse cache figures; ``error`` if it failed.
    ``session``: sent as SMG's ``X-SMG-Routing-Key`` (the consistent-hashing policy's session key)."""
    headers = {} if session is None else {"X-SMG-Routing-Key": f"session-{session}"}
    body = {"model": MODEL, "messages": messages, "max_tokens": 1, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    t0 = time.perf_counter()
    ttft, usage, ext = None, None, {}
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=600) as r:
            if r.status_code != 200:
                detail = r.read().decode(errors="replace")[:300]  # the protocol's error body: why
                return {"error": f"HTTP {r.status_code}", "status": r.status_code, "detail": detail}
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                choices = chunk.get("choices") or []
                # the first token's chunk: the server sends a role-only chunk before any compute
                if ttft is None and any(c["delta"].get("content") or c.get("finish_reason") for c in choices):
                    ttft = time.perf_counter() - t0
                usage = chunk.get("usage") or usage
                ext = chunk.get("kvreuse") or ext
    except httpx.HTTPError as e:
        return {"error": type(e).__name__, "status": None}
    if usage is None:
        return {"error": "no usage chunk", "status": 200}
    tiers = (ext.get("cache") or {}).get("cached_by_tier") or {}
    return {"ttft_s": ttft, "prompt": usage["prompt_tokens"],
            "cached": usage["prompt_tokens_details"]["cached_tokens"], "tiers": tiers}  # fmt: skip


def think_rng(session: int, seed: int, first_turn: int = 0) -> random.Random:
    """The think times of ``session``'s turns from ``first_turn`` on, in repeat ``seed`` (one place, so
    that ``benchmarks/cluster/routing_bound.py`` replays the orders this benchmark sends)."""
    return random.Random(session * 1000 + first_turn + 7919 * seed)


def run_turns(
    url: str, convs, turns: range, out: list[list[dict | None]], think_s: float = 0.5, seed: int = 0
) -> None:
    """Every session's ``turns`` through ``url``, sessions concurrently, each session's turns in order
    after a seeded think time (up to ``think_s``: an agent's tool call; it also keeps the sessions
    out of lockstep, which would let round-robin send a session to the same replica every time)."""

    def one(s: int) -> None:
        rng = think_rng(s, seed, turns.start)
        for t in turns:
            time.sleep(rng.uniform(0, think_s))
            out[s][t] = stream(url, convs[s][t], s)

    threads = [threading.Thread(target=one, args=(s,)) for s in range(len(convs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def metric(urls: list[str], name: str) -> list[int]:
    """The value of the Prometheus sample ``name`` (with its labels, as printed) on each replica;
    -1 for one that does not answer."""
    out = []
    for u in urls:
        try:
            text = httpx.get(u + "/metrics", timeout=10).text
            out.append(int(float(next(x for x in text.splitlines() if x.startswith(name + " ")).split()[-1])))
        except (httpx.HTTPError, StopIteration):
            out.append(-1)
    return out


def served(urls: list[str]) -> list[int]:
    """Requests each replica has taken."""
    return metric(urls, "kvreuse_requests_total")


SHARED_TIER = 'kvreuse_cached_tokens_by_tier_total{tier="shared"}'


def pool_tokens(url: str) -> int:
    """The replica's KV pool in tokens (its ``/v1/loads``)."""
    return httpx.get(url + "/v1/loads", timeout=10).json()["loads"][0]["max_total_num_tokens"]


def reset(urls: list[str]) -> None:
    for u in urls:
        httpx.post(u + "/v1/cache/reset", json={}, timeout=120).raise_for_status()


def summary(records: list[dict], system_len: int = 0, shared_total: int | None = None) -> dict:
    """Hit rates over ``records``: all cached tokens, those from the replica's own pool (not the shared
    tier), and ``session_hit_rate``: hits beyond the first ``system_len`` tokens (the system prompt
    every session shares, page-rounded, which every replica's pool soon holds whatever the routing)
    over the prompt tokens beyond it: what routing decides.  ``shared_total``: the tokens the replicas
    say they read from the shared tier, for records without the split (counted beyond the system
    prompt, which the pools hold); checked against the records' own split where they have one."""
    ok = [r for r in records if r and "error" not in r]
    prompt = sum(r["prompt"] for r in ok)
    shared = sum(r["tiers"].get("shared", 0) for r in ok)
    cached = sum(r["cached"] for r in ok)
    own = sum(max(0, r["cached"] - system_len) for r in ok)
    own_pool = sum(max(0, r["cached"] - r["tiers"].get("shared", 0) - system_len) for r in ok)
    if shared_total is not None and not any(r["tiers"] for r in ok):
        shared, own_pool = shared_total, own - shared_total
    elif shared_total is not None and shared_total != shared:
        progress(f"warning: the replicas count {shared_total} shared-tier tokens, the responses {shared}")
    own_prompt = sum(max(0, r["prompt"] - system_len) for r in ok)
    ttfts = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    return {"requests": len(records), "errors": len(records) - len(ok), "prompt_tokens": prompt,
            "cached_tokens": cached, "shared_tokens": shared, "hit_rate": round(cached / prompt, 4) if prompt else 0,
            "pool_hit_rate": round((cached - shared) / prompt, 4) if prompt else 0,
            "session_hit_rate": round(own / own_prompt, 4) if own_prompt else 0,
            "session_pool_hit_rate": round(own_pool / own_prompt, 4) if own_prompt else 0,
            "ttft_median_s": round(median(ttfts), 4) if ttfts else None,
            "ttft_p90_s": round(percentile(ttfts, 90), 4) if ttfts else None}  # fmt: skip


def history(recs: list[list[dict | None]]) -> float | None:
    """The share of turns after the first whose whole previous prompt came from the replica's own pool (the
    request-level rate at which a turn finds its history); ``None`` where the responses carry no tier split."""
    pairs = [
        (a, b)
        for row in recs
        for a, b in zip(row, row[1:])
        if a and b and "error" not in a and "error" not in b
    ]
    if not pairs or not any(b["tiers"] for _, b in pairs):
        return None
    found = sum(b["cached"] - b["tiers"].get("shared", 0) >= a["prompt"] // 16 * 16 for a, b in pairs)
    return round(found / len(pairs), 4)
