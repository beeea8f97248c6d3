"""The issue's acceptance claims, checked on measured rows: where each pattern's change starts, and
whether the cache reused exactly what lies before it.

``change_start`` is recorded per request while the benchmark runs (it needs the rendered prompts);
``acceptance`` turns a finished run into one pass/fail line per claim, with the figures behind it.
"""

from __future__ import annotations

from typing import Any

from kvreuse.benchmarks.patterns.request import Request

TIMESTAMP_LABEL = "Current time: "
CHECKED = ("append_only", "timestamp_start", "timestamp_end", "tools_reordered", "sliding_window")


def token_at_char(tokenizer: Any, text: str, char: int) -> int:
    """Index of the token covering character ``char`` of ``text`` (tokenised as the prompt was)."""
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return next((i for i, (_, end) in enumerate(offsets) if end > char), len(offsets))


def change_start(name: str, prev: Request, cur: Request, rendered: Any, tokenizer: Any) -> int | None:
    """First token of request ``cur`` that the pattern changed relative to ``prev`` (None: no change).

    timestamps: the first character of the timestamp; tools: the first tool whose position changed;
    sliding window: the first history message, when the window dropped messages.
    """
    if name in ("timestamp_start", "timestamp_end"):
        char = rendered.text.index(TIMESTAMP_LABEL) + len(TIMESTAMP_LABEL)
        return token_at_char(tokenizer, rendered.text, char)
    if name == "tools_reordered":
        order = [[t["function"]["name"] for t in r.tools] for r in (prev, cur)]
        moved = next((i for i, (a, b) in enumerate(zip(*order, strict=True)) if a != b), None)
        if moved is None:
            return None
        # the template writes one JSON object per tool per line: the moved tool starts its line
        name_at = rendered.text.index(f'"name": "{order[1][moved]}"')
        return token_at_char(tokenizer, rendered.text, rendered.text.rfind("\n", 0, name_at) + 1)
    if name == "sliding_window":
        if len(prev.messages) < 2 or cur.messages[1] == prev.messages[1]:
            return None
        first = [s.token_start for s in rendered.segments if s.message_index == 1]
        return first[0] if first else max(s.token_end for s in rendered.segments if s.message_index == 0)
    return None


def _later(run: dict) -> list[dict]:
    return [r for r in run["requests"] if r["divergence"] is not None]


# Hybrid models (rows with ``snapshot_expected``) resume only where a state snapshot ends: the KV match
# (``kv``) is bounded like a dense model's, and the cached part of it must be exactly what the documented
# snapshot policy predicts (benchmarks/patterns/snapshots.py); dense rows have no cut, so kv == cached.
def kv(r: dict) -> int:
    """Tokens the KV pages matched (for hybrids: before the cut back to the last snapshot)."""
    return r["cached_tokens"] + (r.get("snapshot_cut") or 0)


def at_snapshot(r: dict) -> bool:
    """A dense row, or a hybrid row whose cached and cut-back tokens are the policy's prediction."""
    if "snapshot_expected" not in r:
        return True
    return (r["cached_tokens"], r["snapshot_cut"]) == (r["snapshot_expected"], r["snapshot_cut_expected"])


def snapshot_note(rows: list[dict]) -> str:
    """The snapshot accounting behind a hybrid run's check (empty for dense runs)."""
    hyb = [r for r in rows if "snapshot_expected" in r]
    if not hyb:
        return ""
    cut = [r for r in hyb if r["snapshot_cut"]]
    return (
        f" [hybrid: KV pages matched {sum(kv(r) for r in hyb):,} tokens, {sum(r['snapshot_cut'] for r in hyb):,} "
        f"of them on {len(cut)} of {len(hyb)} requests cut back to the last state snapshot; cached tokens equal "
        f"the snapshot policy's prediction on {sum(at_snapshot(r) for r in hyb)} of {len(hyb)}]"
    )


def _append_only(run: dict, page: int) -> tuple[bool, str]:
    t = run["totals"]
    loss = t["prefilled_tokens"] - t["ideal_tokens"]
    ok = t["ideal_tokens"] <= t["prefilled_tokens"] <= t["ideal_paged_tokens"]
    return ok, (
        f"prefilled {t['prefilled_tokens']:,} = ideal {t['ideal_tokens']:,} + {loss:,} tokens of page "
        f"granularity (at most {t['ideal_paged_tokens'] - t['ideal_tokens']:,} with {page}-token pages)"
    )


def _timestamp_start(run: dict, page: int) -> tuple[bool, str]:
    rows = _later(run)
    starts = {r["change_start"] for r in rows}
    most = max(r["cached_tokens"] for r in rows)
    # upper bound: nothing past the timestamp is reused; lower bound: the pages before its first differing digit are
    ok = all(kv(r) <= r["divergence"] and at_snapshot(r) for r in rows)
    ok = ok and all(kv(r) >= r["divergence"] // page * page for r in rows)
    return ok, (
        f"the timestamp begins at token {min(starts)} (after the template's `<|im_start|>system` header and "
        f"the label); requests reuse {min(r['cached_tokens'] for r in rows)}-{most} tokens (the whole pages before "
        f"the first differing digit, token {min(r['divergence'] for r in rows)}-{max(r['divergence'] for r in rows)})"
        + snapshot_note(rows)
    )


def _timestamp_end(run: dict, page: int) -> tuple[bool, str]:
    rows = _later(run)
    ok = all(
        r["change_start"] // page * page <= kv(r)
        and r["prefilled_tokens"] <= r["ideal_paged_tokens"] + (r.get("snapshot_cut") or 0)
        and at_snapshot(r)
        for r in rows
    )
    return ok, (
        f"the timestamp begins at token {min(r['change_start'] for r in rows)}; every request's KV match reached all "
        f"the whole pages before it ({min(kv(r) for r in rows)}-{max(kv(r) for r in rows)} tokens; "
        f"{min(r['cached_tokens'] for r in rows)}-{max(r['cached_tokens'] for r in rows)} cached) and nothing after it"
        + snapshot_note(rows)
    )


def _tools_reordered(run: dict, page: int) -> tuple[bool, str]:
    moved = [r for r in _later(run) if r["change_start"] is not None]
    ok = bool(moved) and all(
        r["change_start"] // page * page <= kv(r)
        and r["prefilled_tokens"] <= r["ideal_paged_tokens"] + (r.get("snapshot_cut") or 0)
        and r["segment"] == "tools"
        and at_snapshot(r)
        for r in moved
    )
    older = sum(r["cached_tokens"] > r["divergence"] for r in moved)
    gaps = [r["divergence"] - r["change_start"] for r in moved]
    return ok, (
        f"on {len(moved)} of {len(_later(run))} requests the order changed; each reused everything up to the "
        f"first moved tool (whose line starts {min(gaps)}-{max(gaps)} tokens before the first differing token: "
        "the shared schema opening) and nothing after it"
        + (
            f"; on {older} of them an older request had kept more tools in place and the cache reused that"
            if older
            else ""
        )
        + snapshot_note(moved)
    )


def _sliding_window(run: dict, page: int) -> tuple[bool, str]:
    rows = _later(run)
    slides = [r for r in rows if r["change_start"] is not None]
    # (reusing more than the previous request shares is fine when an older one shares more: the
    # generic check bounds every request by the ideal)
    lost = [r for r in slides if r["divergence"] < r["prev_tokens"]]
    steady = [r for r in rows if r["change_start"] is None]
    ok = (
        bool(slides) and len(lost) == len(slides) and all(r["divergence"] == r["prev_tokens"] for r in steady)
    )
    # lower bounds: a slide still reuses the static prefix before the first kept message, a steady
    # request the whole previous prompt
    ok = ok and all(kv(r) >= min(r["change_start"], r["divergence"]) // page * page for r in slides)
    ok = ok and all(kv(r) >= r["prev_tokens"] // page * page for r in steady)
    ok = ok and all(at_snapshot(r) for r in rows)
    recomputed = sum(r["prompt_tokens"] - r["cached_tokens"] for r in slides)
    return ok, (
        f"the window slid on {len(slides)} of {len(rows)} requests and every slide lost the reuse of the "
        f"history (reuse stopped at the first kept message, {recomputed:,} tokens prefilled on those "
        f"requests) but kept the static prefix; the other {len(steady)} requests reused the whole previous one"
        + snapshot_note(rows)
    )


def _prefix_reused(run: dict, page: int) -> tuple[bool, str]:
    """Every pattern: each request reuses at least the whole pages it shares with its thread's previous
    request (lower bound) and never more than an earlier request computed (upper bound)."""
    rows = _later(run)
    low = [r for r in rows if kv(r) < min(r["divergence"], r["prompt_tokens"] - 1) // page * page]
    high = [r for r in run["requests"] if r["prefilled_tokens"] < r["ideal_tokens"]]
    off = [r for r in run["requests"] if not at_snapshot(r)]
    return not low and not high and not off, (
        f"{len(rows) - len(low)} of {len(rows)} requests reused every whole page shared with the previous one"
        + (f"; {len(high)} reused more than any earlier request computed" if high else "")
        + (f"; {len(off)} cached other than the snapshot policy predicts" if off else "")
        + snapshot_note(run["requests"])
    )


_CHECKS = {
    "append_only": _append_only,
    "timestamp_start": _timestamp_start,
    "timestamp_end": _timestamp_end,
    "tools_reordered": _tools_reordered,
    "sliding_window": _sliding_window,
}


def acceptance(runs: list[dict], page: int) -> list[dict]:
    """Per run with a prefix cache: the claim's own check (where it has one) and the generic reuse bounds.

    Returns ``{workload, stack, pattern, ok, text}`` rows.  Patterns run without a cache (naive) are not
    checked: every bound below requires reuse, so a target with its cache off fails them all.
    """
    out = []
    for run in runs:
        if not run["cache"] or run["totals"]["prefilled_tokens"] is None or not _later(run):
            continue
        # runs rendered without segments (the agent session's memoised tokenisation, accounting runs) have no
        # change_start: only the generic bounds apply
        bare = run.get("target") == "accounting" or run.get("segments") is False
        own = None if bare else _CHECKS.get(run["pattern"])
        for check in filter(None, (own, _prefix_reused)):
            ok, text = check(run, page)
            out.append({"workload": run["workload"], "stack": run.get("stack"), "pattern": run["pattern"],
                        "replies": run.get("replies"), "check": check.__name__.strip("_"), "ok": ok, "text": text})  # fmt: skip
    return out
