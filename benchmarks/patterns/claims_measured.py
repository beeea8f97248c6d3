"""Claims judged on a measured figure against a bound (``verdicts.Measured``): cost, growth, compaction,
isolation, context size, the status-bar sweep.  Each compute returns (number text, value, bound)."""

from __future__ import annotations

from kvreuse.benchmarks.patterns.verdicts import MAIN, AllOf, Contrast, Measured, Runs


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
    n = R.get("coding", "naive")
    if n is None:
        return None
    share = _quadratic_share([r["prompt_tokens"] for r in n["requests"]])
    num, judged = f"coding (10 requests): quadratic term {share:.0%} of the no-cache prefill", share
    agent = R.get("agent", "append_only")
    if agent is not None:  # the longest session decides: the claim is about growth with session length
        judged = _quadratic_share([r["prompt_tokens"] for r in agent["requests"] if r["thread"] == 0])
        num += f"; agent-scale main thread ({sum(r['thread'] == 0 for r in agent['requests'])} requests): {judged:.0%}"
    return num, judged, 0.5


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


def _sub_flops(R: Runs) -> tuple[str, float, float] | None:
    from kvreuse.benchmarks.patterns.verdicts import sub_flops

    al, own = R.get("fanout", "append_only"), R.get("fanout", "subagent_own_system")
    if al is None or own is None:
        return None
    ctx = lambda r: sum(x["prompt_tokens"] for x in r["requests"] if x["thread"] > 0)  # noqa: E731
    a, o = sub_flops(al), sub_flops(own)
    if not a or not o:  # a run without sub-agents
        return None
    return (f"sub-agent prefill {a / 1e12:.1f} vs {o / 1e12:.1f} TFLOPs (aligned vs own; Qwen3-8B shape); sub-agent "
            f"context {ctx(al):,} vs {ctx(own):,} tokens", o / a, 1.0)  # fmt: skip


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
    first = up["requests"][0]["prompt_tokens"], dfr["requests"][0]["prompt_tokens"]
    return (f"prompt tokens per session {a:,} (all schemas) vs {b:,} (deferred, {a / b:.2f}x); first request "
            f"{first[0]:,} vs {first[1]:,}", a / b, 1.05)  # fmt: skip


def _tokenizers(R: Runs) -> tuple[str, float, float] | None:
    q, l_ = R.get("coding", "append_only"), R.get("coding", "append_only", "llama3.1")
    if q is None or l_ is None:
        return None
    a, b = q["totals"]["prompt_tokens"], l_["totals"]["prompt_tokens"]
    diff = abs(b / a - 1)
    return (
        f"the same session: {a:,} prompt tokens (Qwen3) vs {b:,} (Llama 3.1), {diff:.1%} apart",
        0.10 / max(diff, 1e-9),
        1.0,
    )


def _rule_of_thumb(R: Runs) -> tuple[str, float, float] | None:
    from kvreuse.benchmarks.patterns.sweep import cells, rule_of_thumb

    got = rule_of_thumb(cells(list(R.by.values())))
    return None if got is None else (got[0], got[1], got[2])


MEASURED_CLAIMS = [
    Measured("Without a cache, prefill grows quadratically with the session", "003 §KV Cache 的原理与约束",
             "coding: naive (+ agent: append_only prompts)", _quadratic,
             "value: share of the no-cache total in the quadratic term (least-squares fit of prompt size per "
             "request), on the longest session in the run; bound 50%",
             "each request recomputes a context that grows linearly, so the total grows with the square of the "
             "turn count once the history outweighs the static prefix"),
    AllOf("Prompt caching cuts the cost of an agent session", "001 §为什么要缓存",
          (Measured("Anthropic", "001", "coding: append_only, cache on vs off", _money("Anthropic"),
                    "value: dollars saved vs the cache-off run; bound 50%", "", True),
           Measured("OpenAI", "001", "coding: append_only, cache on vs off", _money("OpenAI"),
                    "value: dollars saved vs the cache-off run; bound 50%", "", True)),
          "cache reads at 0.1x / 0.25x outweigh any write premium as soon as a prefix is read twice"),
    Measured("Compaction near a threshold costs one recomputation per event, not a broken cache",
             "003 §压缩与 KV Cache; 000 §压缩怎样工作", "research: compact_threshold", _compaction,
             "value: share of the cache-off prefill the cache saves (0 when the prefix breaks on more than a fifth "
             "of the requests); bound 50%", "the prefix breaks only where the summary replaces the history; later "
             "turns extend the summary", True),
    Measured("...and byte-aligned sub-agents cost less compute, though each carries the parent's whole prefix",
             "003 §缓存作为架构约束 vs 001 §Subagent 的系统提示词", "fanout: append_only vs subagent_own_system",
             _sub_flops, "value: own-prompt / aligned sub-agent prefill FLOPs (linear layers + attention over the "
             "cached prefix, Qwen3-8B shape); bound 1.0", "the longer aligned contexts cost attention, but "
             "recomputing an own prompt per sub-agent costs more", True, 0.95),
    Measured("Isolation beats compression: a sub-agent's search keeps tens of thousands of tokens out of the main "
             "context", "003 §隔离优于压缩：子 Agent 上下文隔离", "fanout: append_only vs explore_inline", _isolation,
             "value: main-thread context at its largest, search done in the main thread / delegated; bound 1.2x",
             "the search results stay in the sub-agents' contexts; the main thread gets their reports", partly_at=0.95),
    Measured("Deferred tools (names only, schemas on demand) shrink every request", "001 §延迟工具列表",
             "coding: append_only vs tools_deferred", _deferred_size,
             "value: prompt tokens with every schema up front / with unused tools deferred; bound 1.05x",
             "schemas the session never calls are not sent", partly_at=0.95),
    Measured("Token counts differ slightly between tokenizers (the context indicator is an estimate)",
             "000 §Token 是什么", "coding: append_only, qwen3-append vs llama3.1", _tokenizers,
             "value: 10% / the relative difference of prompt tokens; bound 1 (a difference of at most 10%)",
             "BPE vocabularies split code and JSON differently"),
    Contrast("A ~500-token tail rebuilt per request costs less than accumulating it (Anthropic $)",
             "000 §换轮时哪些内容会延续 (segments 12-14)", "research", "status_replace_500", "status_append_500",
             "accumulated tails are read from the cache on every later request; rebuilding one re-prefills it and "
             "the reply after it", _dollars("Anthropic"), "$"),
    Measured("Status bar rule of thumb: append for long trajectories with frequent updates, replace for short "
             "ones or a large status", "003 §状态更新的两种实现与缓存代价", f"coding + research (+ agent) x sizes, {MAIN}",
             _rule_of_thumb, "value: sweep cells where the rule picks the cheaper mode (Anthropic $); bound: all cells",
             "see the sweep table", True),
]  # fmt: skip
