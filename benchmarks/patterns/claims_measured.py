"""Claims judged on a measured figure against a bound (``verdicts.Measured``): cost, growth, compaction,
isolation, context size, the status-bar sweep.  Each compute returns (number text, value, bound)."""

from __future__ import annotations

from dataclasses import dataclass

from kvreuse.benchmarks.patterns.verdicts import CONFIRM, MAIN, NOISE, AllOf, Measured, Runs, ratio


def _dollars(provider: str):  # noqa: ANN202 - a Measure
    def measure(run: dict) -> float:
        from kvreuse.benchmarks.patterns.cost import PRICE_RULES, session_dollars

        rule = next(r for r in PRICE_RULES if r.provider == provider)
        # one price rule for both arms and both cache settings (a cache-off run simply has no cached tokens),
        # so with the cache gone the on- and off-ratios are equal and the effect is exactly 1.0
        return session_dollars(run["requests"], rule)

    return measure


def _money(provider: str):  # noqa: ANN202 - a compute
    def compute(R: Runs) -> tuple[str, float, float] | None:
        on, off = R.get("coding", "append_only"), R.get("coding", "append_only", cache="off")
        if on is None or off is None:
            return None
        from kvreuse.benchmarks.patterns.cost import PRICE_RULES, session_dollars

        rule = next(r for r in PRICE_RULES if r.provider == provider)
        c, u = session_dollars(on["requests"], rule), session_dollars(off["requests"], rule, cache=False)
        saved = 1 - c / u
        return (
            f"{provider}: ${c:.4f} with the cache vs ${u:.4f} with it off per session ({saved:.0%} saved)",
            saved,
            0.5,
        )

    return compute


def _quadratic_share(prompts: list[int]) -> float:
    """Share of the no-cache total that is quadratic: per-request prompt = P + h*k (least squares), so the
    total over n requests is P*n + h*n^2/2; returns (h*n^2/2) / total."""
    import numpy as np

    k = np.arange(len(prompts))
    h, p0 = np.polyfit(k, np.asarray(prompts, dtype=float), 1)
    n = len(prompts)
    quad = max(h, 0.0) * n * n / 2
    return float(quad / (p0 * n + quad)) if p0 * n + quad > 0 else 0.0


def _quadratic(R: Runs) -> tuple[str, float, float] | None:
    """Quadratic share of the cache-off prefill of the longest session, judged against the cache-on one
    (which extends its predecessor, so grows linearly): 0 unless the cache at least halves the share."""
    w = "agent" if R.get("agent", "append_only", cache="off") is not None else "coding"
    on, off = R.get(w, "append_only"), R.get(w, "append_only", cache="off")
    if on is None or off is None:
        return None
    main = lambda r: [x["prefilled_tokens"] for x in r["requests"] if x["thread"] == 0]  # noqa: E731
    s_off, s_on = _quadratic_share(main(off)), _quadratic_share(main(on))
    num = (f"{w} ({len(main(off))} main-thread requests): quadratic term {s_off:.0%} of the cache-off prefill, "
           f"{s_on:.0%} with the cache")  # fmt: skip
    return num, s_off if s_on <= s_off / 2 else 0.0, 0.5


def _compaction(R: Runs) -> tuple[str, float, float] | None:
    c, off, ap = (
        R.get("research", "compact_threshold"),
        R.get("research", "compact_threshold", cache="off"),
        R.get("research", "append_only"),
    )
    if c is None or off is None or ap is None:
        return None
    summaries = sum(
        1 for x in c["requests"] if x["divergence"] is not None and x["divergence"] < x["prev_tokens"]
    )
    saved = 1 - c["totals"]["prefilled_tokens"] / off["totals"]["prefilled_tokens"]
    fewer = 1 - c["totals"]["prompt_tokens"] / ap["totals"]["prompt_tokens"]
    num = (f"prefix broken on {summaries} of {len(c['requests'])} requests (the compaction events); the cache saves "
           f"{saved:.0%} of the cache-off prefill; {fewer:.0%} fewer prompt tokens than append-only")  # fmt: skip
    return num, saved if summaries <= max(1, len(c["requests"]) // 5) else 0.0, 0.5


@dataclass(frozen=True)
class SubFlops:
    """Sub-agent prefill FLOPs with an own prompt / aligned, on one session and stack (a ``Measured``
    compute that the agent-scale table restates on another session: ``scale.at``)."""

    workload: str = "fanout"
    stack: str = MAIN

    def __call__(self, R: Runs) -> tuple[str, float, float] | None:
        from kvreuse.benchmarks.patterns.verdicts import sub_flops

        al, own = (R.get(self.workload, p, self.stack) for p in ("append_only", "subagent_own_system"))
        if al is None or own is None:
            return None
        ctx = lambda r: sum(x["prompt_tokens"] for x in r["requests"] if x["thread"] > 0)  # noqa: E731
        a, o = sub_flops(al), sub_flops(own)
        if not a or not o:  # a run without sub-agents
            return None
        return (f"sub-agent prefill {a / 1e12:.1f} vs {o / 1e12:.1f} TFLOPs (aligned vs own; Qwen3-8B shape), own / "
                f"aligned **{o / a:.2f}x**; sub-agent context {ctx(al):,} vs {ctx(own):,} tokens", o / a, CONFIRM)  # fmt: skip


def _isolation(R: Runs) -> tuple[str, float, float] | None:
    iso, inl = R.get("fanout", "append_only"), R.get("fanout", "explore_inline")
    if iso is None or inl is None:
        return None
    main = lambda r: max(x["prompt_tokens"] for x in r["requests"] if x["thread"] == 0)  # noqa: E731
    pre = lambda r: r["totals"]["prefilled_tokens"]  # noqa: E731
    d = lambda r: _dollars("Anthropic")(r)  # noqa: E731
    num = (f"main context at its largest {main(iso):,} delegated vs {main(inl):,} in-thread ({main(inl) / main(iso):.2f}x); "
           f"prefilled {pre(iso):,} vs {pre(inl):,}; ${d(iso):.4f} vs ${d(inl):.4f} per session (Anthropic)")  # fmt: skip
    return num, main(inl) / main(iso), 1.2


def _deferred_size(R: Runs) -> tuple[str, float, float] | None:
    up, dfr = R.get("coding", "append_only"), R.get("coding", "tools_deferred")
    if up is None or dfr is None:
        return None
    a, b = up["totals"]["prompt_tokens"], dfr["totals"]["prompt_tokens"]
    each = [ratio(x["prompt_tokens"], y["prompt_tokens"]) for x, y in zip(up["requests"], dfr["requests"])]
    return (f"prompt tokens per session {a:,} (all schemas) vs {b:,} (deferred, {ratio(a, b):.3f}x); per request "
            f"{min(each):.3f}x-{max(each):.3f}x (first {each[0]:.3f}x, last {each[-1]:.3f}x)", min(each), NOISE)  # fmt: skip


def _tokenizers(R: Runs) -> tuple[str, float, float] | None:
    q, l_ = R.get("coding", "append_only"), R.get("coding", "append_only", "llama3.1")
    if q is None or l_ is None:
        return None
    a, b = q["totals"]["prompt_tokens"], l_["totals"]["prompt_tokens"]
    diff = abs(ratio(b, a) - 1)
    # "slightly": a difference (>= 1%, so equal counts fail) of at most 10%
    return (f"the same session: {a:,} prompt tokens (Qwen3) vs {b:,} (Llama 3.1), {diff:.1%} apart",
            min(diff / 0.01, 0.10 / max(diff, 1e-9)), 1.0)  # fmt: skip


def _tail(R: Runs) -> tuple[str, float, float] | None:
    rep, app = R.get("research", "status_replace_500"), R.get("research", "status_append_500")
    if rep is None or app is None:
        return None
    d = _dollars("Anthropic")
    r, a = d(rep), d(app)
    off = [R.get("research", p, cache="off") for p in ("status_replace_500", "status_append_500")]
    extra = "" if None in off else f"; with the cache off ${d(off[0]):.4f} vs ${d(off[1]):.4f} ({ratio(d(off[1]), d(off[0])):.2f}x)"  # type: ignore[arg-type]  # fmt: skip
    return f"Anthropic, cache on: rebuilt ${r:.4f} vs accumulated ${a:.4f} per session ({ratio(a, r):.2f}x){extra}", ratio(a, r), CONFIRM  # fmt: skip


def _rule_of_thumb(R: Runs) -> tuple[str, float, float] | None:
    from kvreuse.benchmarks.patterns.sweep import cells, rule_of_thumb

    got = rule_of_thumb(cells(list(R.by.values())))
    return None if got is None else (got[0], got[1], got[2])


CODING_AP = (("coding", "append_only", MAIN),)

# the compute part of the sub-agent row (claims.py): own-prompt sub-agents cost more FLOPs than aligned ones
SUB_FLOPS = Measured("compute", "003 §缓存作为架构约束 vs 001 §Subagent 的系统提示词",
                     "fanout: append_only vs subagent_own_system", SubFlops(),
                     "value: own-prompt / aligned sub-agent prefill FLOPs (linear layers + attention over the cached "
                     "prefix, Qwen3-8B shape); bound 1.2x", "the longer aligned contexts cost attention, but "
                     "recomputing an own prompt per sub-agent costs more", True, NOISE / CONFIRM,
                     (("fanout", "append_only", MAIN), ("fanout", "subagent_own_system", MAIN)))  # fmt: skip

MEASURED_CLAIMS = [
    Measured("Without a cache, prefill grows quadratically with the session", "003 §KV Cache 的原理与约束",
             "append_only, cache off vs on (agent session where it ran, else coding)", _quadratic,
             "value: share of the cache-off total in the quadratic term (least-squares fit of prefill per main-thread "
             "request), on the longest session in the run, 0 unless the cache-on share is at most half of it; bound 50%",
             "each request recomputes a context that grows linearly, so the total grows with the square of the "
             "turn count once the history outweighs the static prefix", True,
             sides=(("agent", "append_only", MAIN),)),
    AllOf("Prompt caching cuts the cost of an agent session", "001 §为什么要缓存",
          (Measured("Anthropic", "001", "coding: append_only, cache on vs off", _money("Anthropic"),
                    "value: dollars saved vs the cache-off run; bound 50%", "", True, sides=CODING_AP),
           Measured("OpenAI", "001", "coding: append_only, cache on vs off", _money("OpenAI"),
                    "value: dollars saved vs the cache-off run; bound 50%", "", True, sides=CODING_AP)),
          "cache reads at 0.1x / 0.25x outweigh any write premium as soon as a prefix is read twice"),
    Measured("Compaction near a threshold costs one recomputation per event, not a broken cache",
             "003 §压缩与 KV Cache; 000 §压缩怎样工作", "research: compact_threshold", _compaction,
             "value: share of the cache-off prefill the cache saves (0 when the prefix breaks on more than a fifth "
             "of the requests); bound 50%", "the prefix breaks only where the summary replaces the history; later "
             "turns extend the summary", True, sides=(("research", "compact_threshold", MAIN),)),
    Measured("Isolation beats compression: a sub-agent's search keeps tens of thousands of tokens out of the main "
             "context", "003 §隔离优于压缩：子 Agent 上下文隔离", "fanout: append_only vs explore_inline", _isolation,
             "value: main-thread context at its largest, search done in the main thread / delegated; bound 1.2x",
             "the search results stay in the sub-agents' contexts; the main thread gets their reports", partly_at=NOISE / 1.2,
             sides=(("fanout", "append_only", MAIN), ("fanout", "explore_inline", MAIN))),
    Measured("Deferred tools (names only, schemas on demand) shrink every request", "001 §延迟工具列表",
             "coding: append_only vs tools_deferred", _deferred_size,
             "value: the smallest per-request ratio of prompt tokens with every schema up front / with unused tools "
             "deferred (every request must shrink); bound 1.05x", "schemas the session never calls are not sent",
             partly_at=1.01 / NOISE, sides=(CODING_AP[0], ("coding", "tools_deferred", MAIN))),
    Measured("Token counts differ slightly between tokenizers (the context indicator is an estimate)",
             "000 §Token 是什么", "coding: append_only, qwen3-append vs llama3.1", _tokenizers,
             "value: min(difference / 1%, 10% / difference) of prompt tokens; bound 1 (a difference of 1-10%: equal "
             "counts fail)", "BPE vocabularies split code and JSON differently",
             sides=(CODING_AP[0], ("coding", "append_only", "llama3.1")), symmetric=True),
    Measured("A ~500-token tail rebuilt per request costs less than accumulating it (Anthropic $)",
             "000 §换轮时哪些内容会延续 (segments 12-14)", "research: status_replace_500 vs status_append_500", _tail,
             "value: accumulated / rebuilt session dollars with the cache on (a cost claim, not a cache claim: the "
             "cache narrows the gap); bound 1.2x", "rebuilding keeps one tail in the prompt; accumulated tails are "
             "cheap cache reads but still paid for", partly_at=NOISE / CONFIRM,
             sides=(("research", "status_replace_500", MAIN), ("research", "status_append_500", MAIN))),
    Measured("Status bar rule of thumb: append for long trajectories with frequent updates, replace for short "
             "ones or a large status", "003 §状态更新的两种实现与缓存代价", f"coding + research + agent x sizes, {MAIN}",
             _rule_of_thumb, "value: the smaller of the two halves' shares of sweep cells where the rule picks the cheaper "
             "mode (Anthropic $); bound 100%",
             "see the sweep table", True),
]  # fmt: skip
