"""The verdict table: every claim of the sources, the pattern pair measuring it, the number, the verdict.

Sources (in ``shared/seeds``): [000] a product's context-management guide (request layout, tool order,
capability toggles, compaction); [001] an analysis of Claude Code's context (static/dynamic system prompt,
``<system-reminder>`` messages with the date, sub-agents with their own system prompt, caching to cut cost);
[003] a book chapter on context engineering (experiment 2-3's harmful patterns, status bar, skills,
compression, sub-agents byte-aligned with the parent).  Verdicts are computed from the token-exact runs
(``qwen3-append`` stack unless a claim is about a template), never written by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

MAIN = "qwen3-append"


class Verdict(NamedTuple):
    claim: str
    source: str
    pattern: str
    number: str
    verdict: str  # confirmed | refuted | partly | not measurable here
    why: str


class Runs:
    """Look-up of token-exact runs by (workload, stack, pattern, replies)."""

    def __init__(self, runs: list[dict]) -> None:
        self.by = {(r["workload"], r.get("stack"), r["pattern"], r.get("replies", "cached")): r for r in runs}

    def get(self, workload: str, pattern: str, stack: str = MAIN, replies: str = "cached") -> dict | None:
        return self.by.get((workload, stack, pattern, replies))

    def pre(self, workload: str, pattern: str, stack: str = MAIN, replies: str = "cached") -> int | None:
        r = self.get(workload, pattern, stack, replies)
        return None if r is None else r["totals"]["prefilled_tokens"]


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def _n(v: float) -> str:
    return f"{v:,.0f}"


Check = Callable[[Runs], Verdict | None]


def _ratio_claim(claim: str, source: str, workload: str, pattern: str, ref: str, confirm_at: float,
                 why_yes: str, why_no: str) -> Check:  # fmt: skip
    def check(R: Runs) -> Verdict | None:
        a, b = R.pre(workload, pattern), R.pre(workload, ref)
        if a is None or b is None:
            return None
        ok = a / b >= confirm_at
        num = f"{_n(a)} vs {_n(b)} prefilled ({_x(a, b)} `{ref}`)"
        return Verdict(
            claim,
            source,
            f"{workload}:{pattern}",
            num,
            "confirmed" if ok else "refuted",
            why_yes if ok else why_no,
        )

    return check


def _timestamp_end(R: Runs) -> Verdict | None:
    a, b, n = R.pre("coding", "timestamp_end"), R.pre("coding", "append_only"), R.pre("coding", "naive")
    if None in (a, b, n):
        return None
    return Verdict(
        "Dynamic content goes last: a timestamp at the end of the system prompt keeps the cache",
        "[003] 2-3", "coding:timestamp_end", f"{_n(a)} prefilled = {_x(a, b)} append-only, {1 - a / n:.0%} saved vs naive",
        "partly", "only the system text before it is reused: the tools and the whole history come after it in the "
        "rendered prompt and are recomputed every turn; the fix the source gives (a message at the end) is append-only",
    )  # fmt: skip


def _tools_first(R: Runs) -> Verdict | None:
    a, b = R.pre("coding", "timestamp_end_tools_first"), R.pre("coding", "timestamp_end")
    if a is None or b is None:
        return None
    ok = a < 0.9 * b
    return Verdict(
        "Order the prompt system -> tools -> messages with the most stable part first (tools before the system text)",
        "[003], [001]", "coding:timestamp_end_tools_first", f"{_n(a)} vs {_n(b)} prefilled with the Qwen3 order",
        "confirmed" if ok else "refuted",
        "with the tools first, a change at the end of the system text keeps the tool block cached; the history is "
        "still recomputed" if ok else "the tool block is small next to the history here",
    )  # fmt: skip


def _pair(claim: str, source: str, workload: str, good: str, bad: str, why: str, stack: str = MAIN) -> Check:
    def check(R: Runs) -> Verdict | None:
        g, b = R.pre(workload, good, stack), R.pre(workload, bad, stack)
        if g is None or b is None:
            return None
        verdict = "confirmed" if g < b else "refuted"
        num = f"`{good}` {_n(g)} vs `{bad}` {_n(b)} prefilled ({_n(b - g)} more)"
        return Verdict(
            claim, source, f"{workload}:{good} vs {bad}", num, verdict, why if g < b else "no saving here"
        )

    return check


def _dynamic_tools(R: Runs) -> Verdict | None:
    g, b, ap = (
        R.pre("coding", "tools_dynamic_after"),
        R.pre("coding", "tools_dynamic_sorted_in"),
        R.pre("coding", "append_only"),
    )
    if None in (g, b, ap):
        return None
    return Verdict(
        "Stable tools sorted by name, dynamic tools after them", "[000]", "coding:tools_dynamic_after vs sorted_in",
        f"{_n(g)} vs {_n(b)} prefilled (append-only {_n(ap)})", "partly" if g < b else "refuted",
        "after the stable tools the change starts later, but in Qwen3's layout the tools sit before the history, so "
        f"connecting a tool server recomputes the whole history either way (+{_n(g - ap)} over append-only); "
        "only the tools after the insertion point differ",
    )  # fmt: skip


def _status(R: Runs) -> Verdict | None:
    rep, app = R.pre("coding", "status_replace"), R.pre("coding", "status_append")
    rep0, app0 = (
        R.pre("coding", "status_replace", replies="replayed"),
        R.pre("coding", "status_append", replies="replayed"),
    )
    if rep is None or app is None:
        return None
    old = f"; first edition's replayed replies: {_n(rep0)} vs {_n(app0)}" if rep0 is not None else ""
    return Verdict(
        "A status bar replaced every turn costs the turns after it; appended and never removed it costs nothing",
        "[003] status bar", "coding:status_replace vs status_append",
        f"replace {_n(rep)} vs append {_n(app)} prefilled ({_n(rep - app)} more, {_x(rep, app)}){old}",
        "confirmed" if rep > app else "refuted",
        "with cached replies, removing the old status invalidates the reply generated after it, so each turn "
        "recomputes status + reply; appending keeps every reply cached",
    )  # fmt: skip


def _subagent(R: Runs) -> Verdict | None:
    al, own = R.get("fanout", "append_only"), R.get("fanout", "subagent_own_system")
    if al is None or own is None:
        return None
    sub = lambda r: sum(x["prefilled_tokens"] for x in r["requests"] if x["thread"] > 0)  # noqa: E731
    ctx = lambda r: sum(x["prompt_tokens"] for x in r["requests"] if x["thread"] > 0)  # noqa: E731
    return Verdict(
        "Sub-agents byte-aligned with the parent [003] vs with their own system prompt [001]", "[003] vs [001]",
        "fanout:append_only vs subagent_own_system",
        f"sub-agent prefill {_n(sub(al))} aligned vs {_n(sub(own))} own; sub-agent context {_n(ctx(al))} vs {_n(ctx(own))}",
        "partly",
        "aligned sub-agents reuse the parent's whole static prefix (prefill only their own turns) but carry it in "
        "every request's attention; an own short prompt is prefilled once per sub-agent and keeps contexts small. "
        "Which is cheaper depends on prefix length vs sub-agent count; both are cache-correct",
    )  # fmt: skip


def _reasoning(R: Runs) -> Verdict | None:
    st, ap = R.pre("coding", "append_only", "qwen3-stock"), R.pre("coding", "append_only", "qwen3-append")
    if st is None or ap is None:
        return None
    return Verdict(
        "Qwen3's stock template (old reasoning stripped at each new user query) breaks the prefix",
        "Qwen3 template", "coding:append_only qwen3-stock vs qwen3-append", f"{_n(st)} vs {_n(ap)} prefilled ({_x(st, ap)})",
        "confirmed" if st > ap else "refuted",
        "the stripped think blocks were generated and cached; at the follow-up query they disappear from the "
        "history and everything after the first one is recomputed",
    )  # fmt: skip


def _compaction(R: Runs) -> Verdict | None:
    c, ap = R.get("research", "compact_threshold"), R.get("research", "append_only")
    if c is None or ap is None:
        return None
    breaks = sum(
        1 for r in c["requests"] if r["divergence"] is not None and r["divergence"] < r["prev_tokens"]
    )
    a, b = c["totals"], ap["totals"]
    ok = breaks <= max(1, len(c["requests"]) // 5) and a["prompt_tokens"] < b["prompt_tokens"]
    return Verdict(
        "Compaction at a threshold costs one recomputation per event, not a broken cache", "[003], [000]",
        "research:compact_threshold",
        f"prefix broken on {breaks} request(s); prefilled {_n(a['prefilled_tokens'])} vs {_n(b['prefilled_tokens'])} "
        f"append-only, for {1 - a['prompt_tokens'] / b['prompt_tokens']:.0%} fewer prompt tokens",
        "confirmed" if ok else "refuted",
        "the prefix breaks only where the summary replaces the history; later turns extend the summary",
    )  # fmt: skip


def _quadratic_share(prompts: list[int]) -> float:
    """Share of the no-cache total that is quadratic: per-request prompt = P + h*k (least squares), so the
    total over n requests is P*n + h*n^2/2; returns (h*n^2/2) / total."""
    import numpy as np

    k = np.arange(len(prompts))
    h, p0 = np.polyfit(k, np.asarray(prompts, dtype=float), 1)
    n = len(prompts)
    quad = max(h, 0.0) * n * n / 2
    return float(quad / (p0 * n + quad)) if p0 * n + quad > 0 else 0.0


def _quadratic(R: Runs) -> Verdict | None:
    from benchmarks.patterns.cost import prefill_flops

    n, ap = R.get("coding", "naive"), R.get("coding", "append_only")
    if n is None or ap is None:
        return None
    share = _quadratic_share([r["prefilled_tokens"] for r in n["requests"]])
    fl = prefill_flops(n["requests"]) / prefill_flops(ap["requests"])
    num = f"coding: quadratic term {share:.0%} of the no-cache prefill, FLOPs {fl:.1f}x append-only (Qwen3-8B shape)"
    agent = R.get("agent", "append_only")
    best = share
    if agent is not None:  # no-cache prefill = every prompt token of the append-only requests
        main = [r["prompt_tokens"] for r in agent["requests"] if r["thread"] == 0]
        best = _quadratic_share(main)
        num += f"; agent-scale main thread: {best:.0%}, {sum(main):,} tokens without a cache vs {agent['totals']['prefilled_tokens']:,}"
    ok = best >= 0.5
    return Verdict(
        "Without a cache, prefill grows quadratically with the session", "[003] KV cache",
        "coding:naive" + (", agent:append_only" if agent else ""), num, "confirmed" if ok else "partly",
        "each request recomputes a context that grows linearly, so the total grows with the square of the turn "
        "count once the history outweighs the static prefix" if ok else "at this session length the recomputed "
        "context is mostly the constant static prefix, so the total grows nearly linearly",
    )  # fmt: skip


def _money(R: Runs) -> Verdict | None:
    from benchmarks.patterns.cost import PRICE_RULES, session_dollars

    ap = R.get("coding", "append_only")
    if ap is None:
        return None
    rule = PRICE_RULES[0]
    c, u = session_dollars(ap["requests"], rule), session_dollars(ap["requests"], rule, cache=False)
    return Verdict(
        "Prompt caching cuts the cost of an agent session", "[001]", "coding:append_only priced",
        f"${c:.4f} cached vs ${u:.4f} uncached per session ({rule.provider} rules)", "confirmed" if c < u else "refuted",
        "cache reads at 0.1x outweigh the 1.25x write premium as soon as a prefix is read twice",
    )  # fmt: skip


def _ideal(R: Runs) -> Verdict | None:
    ap = R.get("coding", "append_only")
    if ap is None:
        return None
    t = ap["totals"]
    ok = t["ideal_tokens"] <= t["prefilled_tokens"] <= t["ideal_paged_tokens"]
    return Verdict(
        "Append-only context with a static prefix reuses everything", "[003], [001]", "coding:append_only",
        f"prefilled {_n(t['prefilled_tokens'])}, ideal {_n(t['ideal_tokens'])} ({_n(t['ideal_paged_tokens'])} in whole pages)",
        "confirmed" if ok else "refuted", "the gap is page granularity only (replies cached by forced decoding)",
    )  # fmt: skip


CHECKS: list[Check] = [
    _ideal,
    _ratio_claim("A timestamp at the start of the system prompt invalidates the whole cache", "[003] 2-3",
                 "coding", "timestamp_start", "naive", 0.95, "it prefills as much as no cache at all",
                 "a large part of the prompt is still reused"),
    _timestamp_end,
    _tools_first,
    _ratio_claim("A live user-profile message near the start breaks the cache", "[003] 2-3", "coding",
                 "user_profile", "append_only", 1.5, "the static prefix is reused, the whole history after it is not",
                 "the cost is small here"),
    _ratio_claim("Reordering tools (e.g. by usage) breaks the cache", "[003] 2-3", "coding", "tools_reordered",
                 "append_only", 2.0, "reuse stops at the first moved tool; everything after is recomputed",
                 "few tools moved"),
    _dynamic_tools,
    _pair("Capability changes alter the reusable range: a withdrawn schema costs more than a message saying so",
          "[000]", "coding", "tools_toggle_message", "tools_toggled",
          "each schema change recomputes everything after the tool block (twice: off and on); the reminder is appended"),
    _ratio_claim("A sliding window over the history breaks the prefix", "[003] 2-3", "coding", "sliding_window",
                 "append_only", 1.3, "every slide recomputes from the first kept message", "slides are rare here"),
    _pair("A window that drops in blocks (half when full) breaks less often than one that slides per message",
          "issue #18", "coding", "sliding_window_block", "sliding_window",
          "it breaks once per half-window instead of every turn"),
    _pair("USER:/ASSISTANT: text is cache-neutral when byte-stable; only unstable formatting breaks the cache",
          "[003] 2-3", "coding", "text_stable", "text_unstable",
          "the stable flattening extends the previous request; [i/N] labels rewrite every entry"),
    _status,
    _pair("A status bar inside the system prompt breaks the whole prefix; at the end it does not", "[003] status bar",
          "coding", "status_replace", "status_in_system", "in the system prompt every turn recomputes tools and history"),
    _pair("Compress in batches at a threshold, not every turn", "[003] compression", "research", "compress_budget",
          "compress_every_turn", "a moving stub boundary breaks the prefix on every request"),
    _pair("Tool-result stubs must be frozen when first made", "[003] Claude Code", "research", "compress_budget",
          "compress_unfrozen", "a stub that is re-rendered breaks the prefix at the oldest stub every turn"),
    _compaction,
    _subagent,
    _pair("A skill loaded into the system prompt breaks the cache; delivered as a message it does not",
          "[003] skills", "coding", "skill_in_messages", "skill_in_system",
          "the system prompt precedes tools and history, so loading the skill there recomputes all of it"),
    _pair("A date-only reminder belongs in the messages, not the system prompt", "[001] system-reminder", "coding",
          "date_in_messages", "date_in_system", "in the system prompt the day change recomputes the whole context once"),
    _reasoning,
    _quadratic,
    _money,
]  # fmt: skip


def verdicts(runs: list[dict]) -> list[Verdict]:
    R = Runs(runs)
    return [v for check in CHECKS if (v := check(R)) is not None]


def table(vs: list[Verdict]) -> list[str]:
    lines = ["| claim | source | pattern | number | verdict | why |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {v.claim} | {v.source} | `{v.pattern}` | {v.number} | **{v.verdict}** | {v.why} |" for v in vs
    ]
    return lines


def missing_claims(runs: list[dict]) -> list[str]:
    """Claims whose runs are not in this report (e.g. a --quick run)."""
    R: Any = Runs(runs)
    return [getattr(c, "__name__", "claim") for c in CHECKS if c(R) is None]
