"""One pattern over one workload, from an empty cache: render every request, send it to a target,
and keep per-request rows and totals (the core of the pattern benchmark; ``benchmarks/patterns/pattern_runner.py``
plans the runs and writes the report, ``sections.py`` adds the extra sections)."""

from __future__ import annotations

from typing import Any

from kvreuse.benchmarks.patterns import Pattern, ideal_prefill
from kvreuse.benchmarks.patterns.checks import change_start
from kvreuse.benchmarks.patterns.ideal import as_arrays, best_prefix, computed_streams
from kvreuse.benchmarks.patterns.snapshots import SnapshotPolicy, expected_reuse
from kvreuse.benchmarks.patterns.stacks import STACKS, Stack, render_request, reply_tokens, template_source
from kvreuse.benchmarks.patterns.targets import Measured
from kvreuse.benchmarks.workloads import Trajectory

DEFAULT_STACK = STACKS["smollm2"]


def render_all(
    tokenizer: Any,
    pattern: Pattern,
    traj: Trajectory,
    stack: Stack = DEFAULT_STACK,
    replies: str = "cached",
    fast: Any = None,
) -> tuple[list[Any], list[list[int]] | None]:
    """Every request's rendering and, with cached replies, the reply ids each request generates."""
    source = template_source(stack, tokenizer, pattern.template)
    reqs = pattern.requests(traj)
    if fast is not None:  # no segments: text and ids only (``fast`` is a PieceTokenizer)
        from kvreuse.chat_templates import RenderedPrompt, render_text

        texts = [render_text(tokenizer, r.messages, r.tools, template=source, **{**r.template_kwargs, **stack.kwargs})
                 for r in reqs]  # fmt: skip
        rendered = [RenderedPrompt(t, fast(t), []) for t in texts]
    else:
        rendered = [render_request(tokenizer, source, stack, r) for r in reqs]
    if replies != "cached":
        return rendered, None
    forced = [
        reply_tokens(tokenizer, source, stack, req, rp, traj.turns[k].assistant)
        for k, (req, rp) in enumerate(zip(reqs, rendered, strict=True))
    ]
    return rendered, forced


def divergence(rendered: list[Any], traj: Trajectory, k: int) -> dict[str, Any]:
    """Where request k first differs from the previous request of its thread, and in which segment."""
    from kvreuse.chat_templates import first_divergence, locate

    earlier = [j for j in traj.thread_turns(k)[:-1]] or list(range(k))
    if not earlier:
        return {"divergence": None, "prev_tokens": None, "segment": None, "message_index": None}
    prev = rendered[earlier[-1]].token_ids
    cur = rendered[k]
    d = first_divergence(prev, cur.token_ids)
    seg = locate(cur, d) if d < len(cur.token_ids) and cur.segments else None
    return {
        "divergence": d,
        "prev_tokens": len(prev),
        "segment": seg.kind if seg else None,
        "message_index": seg.message_index if seg else None,
    }


def run_pattern(
    target: Any,
    tokenizer: Any,
    pattern: Pattern,
    traj: Trajectory,
    tick: Any,
    page: int,
    rendered: tuple[list[Any], list[list[int]] | None] | None = None,
    stack: Stack = DEFAULT_STACK,
    replies: str = "cached",
) -> dict:
    """One pattern over one workload from an empty cache; returns per-request rows and totals.

    ``replies="cached"`` forces each turn's reply through the target as generated output (its KV is
    cached); ``"replayed"`` generates ``max_tokens`` throwaway tokens and the next turn prefills the reply.
    ``tick(row)`` is called after each request with its measured row.
    """
    rendered, forced = (
        rendered if rendered is not None else render_all(tokenizer, pattern, traj, stack, replies)
    )
    reqs = pattern.requests(traj)
    target.reset()
    rows, outputs = [], []
    for k, (req, rp) in enumerate(zip(reqs, rendered, strict=True)):
        m: Measured = target.send(req, rp.token_ids, pattern.cache, forced[k] if forced else None)
        outputs.append(m.output_token_ids)
        row = {"turn": k, "thread": traj.turns[k].thread, "prompt_tokens": m.prompt_tokens,
               "rendered_tokens": len(rp.token_ids), "cached_tokens": m.cached_tokens,
               "prefilled_tokens": m.prefilled_tokens, "generated_tokens": len(m.output_token_ids),
               "ttft_s": m.ttft_s, "prefill_s": m.prefill_s, "decode_s": m.decode_s,
               "snapshot_cut": m.snapshot_cut}  # fmt: skip
        if m.cached_host_tokens or m.cached_disk_tokens:  # where the hit came from (KV tiers)
            row.update(cached_host_tokens=m.cached_host_tokens, cached_disk_tokens=m.cached_disk_tokens)
        row.update(divergence(rendered, traj, k))
        prev = (traj.thread_turns(k)[:-1] or list(range(k)) or [None])[-1]
        row["change_start"] = (
            None
            if prev is None or not rp.segments
            else change_start(pattern.name, reqs[prev], req, rp, tokenizer)
        )
        rows.append(row)
        tick(row)
    ids = [rp.token_ids for rp in rendered]
    streams = as_arrays(computed_streams(ids, outputs))
    for k, row in enumerate(rows):
        reusable = best_prefix(ids[k], streams[:k]) if pattern.cache else 0
        row["ideal_tokens"] = max(1, len(ids[k]) - reusable) if pattern.cache else len(ids[k])
        row["ideal_paged_tokens"] = (
            max(1, len(ids[k]) - reusable // page * page) if pattern.cache else len(ids[k])
        )
    assert [r["ideal_tokens"] for r in rows] == (
        ideal_prefill(ids, outputs) if pattern.cache else [len(i) for i in ids]
    )
    policy = getattr(target, "snapshot_policy", None)
    if policy is not None and pattern.cache:  # a hybrid: what the snapshot policy says it reuses
        for row, e in zip(rows, expected_reuse(SnapshotPolicy(*policy), ids, outputs), strict=True):
            row["snapshot_expected"], row["snapshot_cut_expected"] = e.cached, e.cut
    return {"workload": traj.name, "variant": traj.variant, "pattern": pattern.name, "claim": pattern.claim,
            "stack": stack.name, "replies": replies, "cache": pattern.cache, "requests": rows,
            "totals": totals(rows), "reset_note": target.reset_note}  # fmt: skip


def _sum(rows: list[dict], key: str) -> float | None:
    vals = [r.get(key) for r in rows]
    return None if any(v is None for v in vals) else sum(vals)


def totals(rows: list[dict]) -> dict[str, Any]:
    t = {k: _sum(rows, k) for k in ("prompt_tokens", "cached_tokens", "prefilled_tokens", "ideal_tokens",
                                     "ideal_paged_tokens", "generated_tokens", "ttft_s", "prefill_s", "decode_s",
                                     "snapshot_cut")}  # fmt: skip
    t["reuse_ratio"] = None if t["cached_tokens"] is None else t["cached_tokens"] / max(1, t["prompt_tokens"])
    t["distance_to_ideal"] = (
        None if t["prefilled_tokens"] is None else t["prefilled_tokens"] - t["ideal_tokens"]
    )
    t["max_context"] = max(r["prompt_tokens"] for r in rows)
    return t
