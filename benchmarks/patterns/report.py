"""Turn benchmark results into report.md, PNG plots and per-pattern explanations drawn from the numbers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from kvreuse.benchmarks.patterns.checks import acceptance


def _n(v: Any) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


def _pct(v: Any) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def _s(v: Any) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _saved(t: dict) -> str:
    derived = t.get("savings_basis") == "derived"
    return _pct(t.get("savings_vs_naive")) + ("*" if derived else "")


def explain(run: dict) -> str:
    """One paragraph saying what the figures of one run show: where reuse stops, how often, what it cost."""
    rows, t = run["requests"], run["totals"]
    later = [r for r in rows if r["divergence"] is not None]
    broken = [r for r in later if r["divergence"] < r["prev_tokens"]]
    parts = [f"**{run['pattern']}** ({run['claim']}):"]
    if not run["cache"]:
        parts.append(f"prefix cache off, so all {_n(t['prompt_tokens'])} prompt tokens were prefilled.")
    elif not broken:
        parts.append(
            f"every request extended the previous one of its thread ({len(later)} of {len(later)} turns)."
        )
    else:
        where = Counter((r["divergence"], r["segment"]) for r in broken).most_common(1)[0][0]
        segs = Counter(r["segment"] for r in broken).most_common(1)[0][0]
        same = sum(1 for r in broken if (r["divergence"], r["segment"]) == where)
        parts.append(
            f"the previous request stopped being a prefix on {len(broken)} of {len(later)} turns; most often reuse "
            f"stops at token {where[0]} (segment `{where[1]}`, {same} turns), typically in segment `{segs}`."
        )
    if t["prefilled_tokens"] is not None and (t.get("savings_vs_naive") or 0) < 0 and run.get("naive_prompt"):
        extra = t["prompt_tokens"] - run["naive_prompt"]
        parts.append(
            f"It prefills more than naive because its prompts are {_n(extra)} tokens longer in all (what the pattern "
            f"adds) while the cache reused only {_n(t['cached_tokens'])} of them."
        )
    if t["prefilled_tokens"] is not None:
        saved = t.get("savings_vs_naive")
        parts.append(
            f"Prefilled {_n(t['prefilled_tokens'])} of {_n(t['prompt_tokens'])} prompt tokens (reuse "
            f"{_pct(t['reuse_ratio'])}{'' if saved is None else f', {_saved(t)} saved vs naive'}); the ideal "
            f"for these prompts is {_n(t['ideal_tokens'])} ({_n(t['ideal_paged_tokens'])} counting whole "
            f"{run.get('page', 16)}-token pages only), so the cache missed {_n(t['distance_to_ideal'])} reusable tokens"
        )
        paged = t["prefilled_tokens"] <= t["ideal_paged_tokens"]
        parts[-1] += ", all of it page granularity." if paged and t["distance_to_ideal"] else "."
    else:
        parts.append(f"The target reports no cached tokens; total TTFT {_s(t['ttft_s'])} s.")
    return " ".join(parts)


def snapshot_table(runs: list[dict]) -> list[str]:
    """Hybrid runs: the KV match, the part before the last state snapshot (cached) and the policy's prediction."""
    hyb = [r for r in runs if any("snapshot_expected" in x for x in r["requests"])]
    if not hyb:
        return []
    lines = ["", "## Snapshot accounting (hybrid model)", "",
             "A hybrid resumes a prefix only where a linear-attention state snapshot ends; *KV matched*: whole pages "
             "shared with an earlier request (as for a dense model); *cut back*: of those, tokens after the last "
             "snapshot, recomputed; *predicted*: cached tokens replayed from the documented snapshot policy "
             "(`benchmarks/patterns/snapshots.py`: prefill chunk ends, every K pages, ends of cut-back matches, "
             "decode ends).", "",
             "| stack | pattern | requests | KV matched | cached | cut back (requests) | predicted cached | as predicted |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in hyb:
        xs = r["requests"]
        kv = sum(x["cached_tokens"] + x["snapshot_cut"] for x in xs)
        cut = [x for x in xs if x["snapshot_cut"]]
        same = sum((x["cached_tokens"], x["snapshot_cut"]) == (x["snapshot_expected"], x["snapshot_cut_expected"])
                   for x in xs)  # fmt: skip
        lines.append(f"| {r.get('stack')} | {r['pattern']} | {len(xs)} | {_n(kv)} | {_n(r['totals']['cached_tokens'])} | "
                     f"{_n(sum(x['snapshot_cut'] for x in cut))} ({len(cut)}) | "
                     f"{_n(sum(x['snapshot_expected'] for x in xs))} | {same} of {len(xs)} |")  # fmt: skip
    return lines


def table(runs: list[dict]) -> list[str]:
    head = "| pattern | prompt | cached | prefilled | ideal | reuse | saved vs naive | distance to ideal | max context | TTFT total (s) |"
    lines = [head, "|" + "---|" * 10]
    for r in runs:
        t = r["totals"]
        lines.append(
            f"| {r['pattern']} | {_n(t['prompt_tokens'])} | {_n(t['cached_tokens'])} | {_n(t['prefilled_tokens'])} "
            f"| {_n(t['ideal_tokens'])} | {_pct(t['reuse_ratio'])} | {_saved(t)} "
            f"| {_n(t['distance_to_ideal'])} | {_n(t['max_context'])} | {_s(t['ttft_s'])} |"
        )
    return lines


def _header(meta: dict) -> list[str]:
    m = meta.get("machine", {})
    plan = "quick" if meta.get("quick") else "full" if meta.get("full") else "default"
    la = lambda v: "n/a" if not v else "/".join(f"{x:.1f}" for x in v)  # noqa: E731
    lines = [
        f"Machine: {m.get('cpu_model', '?')}, {m.get('cpu_count', '?')} CPUs, torch {m.get('torch', '?')} with "
        f"{m.get('torch_threads', '?')} threads; load average (1/5/15 min) {la(m.get('load_average'))} at "
        f"the start, {la(meta.get('load_average_end'))} at the end; {m.get('date', '')}.",
        f"Plan: {plan}; {meta.get('wall_s', 0):.0f} s wall ({meta.get('tokens_s', 0):.0f} s token-exact sections); "
        f"page size {meta['page_size']}.",
        "",
        "Token-exact sections: tiny random 1-layer models with real vocabularies (Qwen3: the Qwen2 BPE + Qwen3's "
        "added tokens at their ids; Llama 3: the Llama 3 BPE; from llama-cpp-python 0.3.36's vocab GGUFs), fp32, "
        "in-process engine. Token counts do not depend on weights. *Cached replies*: each turn's scripted reply is "
        "forced through the engine as generated tokens (the ids the template renders for it as the last turn), "
        "so its KV is cached as a real generation's would be; *replayed*: the first edition's mode (2 throwaway "
        "tokens, the reply prefilled next turn).",
    ]
    lines += [line for n in meta.get("notes", []) for line in ("", f"> {n}")]
    lines.append("")
    for name, note in meta.get("stacks", {}).items():
        lines.append(f"- `{name}`: {note}")
    if meta.get("target") != "none":
        lines += ["", f"Timed sections: {meta['target']} ({meta.get('model')}), dtype {meta.get('dtype', 'n/a')}, "
                  f"device {meta.get('device', 'n/a')}."]  # fmt: skip
    return lines


def _cost(runs: list[dict], stack: str = "qwen3-append") -> list[str]:
    from kvreuse.benchmarks.patterns.cost import PRICE_RULES, QWEN3_8B, prefill_flops, session_dollars

    lines = ["| provider | model | input $/MTok | output $/MTok | uncached input (write) | cached input (read) | source |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    lines += [f"| {r.provider} | {r.model} | {r.input_per_mtok} | {r.output_per_mtok} | {r.cache_write}x | "
              f"{r.cache_read}x | {r.source} |" for r in PRICE_RULES]  # fmt: skip
    lines += ["", f"Per session (coding workload, `{stack}`); FLOPs: prefill of a {QWEN3_8B.name} model "
              "(linear layers + causal attention over the cached prefix).", "",
              "| pattern | " + " | ".join(f"{r.provider} $" for r in PRICE_RULES) + " | prefill PFLOPs |",
              "|---|" + "---|" * (len(PRICE_RULES) + 1)]  # fmt: skip
    sel = [
        r
        for r in runs
        if r["workload"] == "coding" and r.get("stack") == stack and r.get("replies") == "cached"
    ]
    for r in sel:
        money = " | ".join(f"{session_dollars(r['requests'], rule, r['cache']):.4f}" for rule in PRICE_RULES)
        lines.append(f"| {r['pattern']} | {money} | {prefill_flops(r['requests']) / 1e15:.2f} |")
    return lines


def _stack_table(runs: list[dict], workload: str) -> list[str]:
    from kvreuse.benchmarks.patterns.report_plots import reference_ideal

    ref = reference_ideal(runs)
    sel = [r for r in runs if r["workload"] == workload and r.get("replies") == "cached"]
    stacks = list(dict.fromkeys(r["stack"] for r in sel))
    pats = list(dict.fromkeys(r["pattern"] for r in sel))
    by = {(r["stack"], r["pattern"]): r["totals"] for r in sel}
    head = "| pattern | " + " | ".join(f"{s} prompt | {s} prefilled (x ideal)" for s in stacks) + " |"
    note = ("*x ideal*: prefilled / the append-only session's ideal for the same stack (each token of the "
            "append-only conversation computed once). A reference, not a floor: a pattern that sends fewer tokens "
            "(compaction and windows drop history; text flattening renders fewer template tokens; stock Qwen3's "
            "ideal itself pays for stripped reasoning) can go below 1.0x. Each run's own ideal, in the detail "
            "table, is a floor: no run prefills less.")  # fmt: skip
    lines = [head, "|---|" + "---|---|" * len(stacks)]
    for p in pats:
        cells = []
        for s in stacks:
            t = by.get((s, p))
            base = ref.get((workload, s)) or (t or {}).get("ideal_tokens") or 1
            cells.append("- | -" if t is None else
                         f"{_n(t['prompt_tokens'])} | {_n(t['prefilled_tokens'])} ({t['prefilled_tokens'] / base:.2f}x)")  # fmt: skip
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return [note, "", *lines]


def _timed(timed: list[dict], curve: list[dict]) -> list[str]:
    if not timed:
        return []
    naive = next((r for r in timed if r["pattern"] == "naive"), None)
    lines = ["", "## TTFT (embedded model, interleaved rounds)", "",
             f"Each pattern ran {timed[0].get('rounds', 1)} times from an empty cache, rounds interleaved across patterns "
             "(order rotated each round); replies replayed (forced decoding of every reply costs ~40 ms a token on this "
             "CPU and would not fit the budget), so prefilled tokens here include the replies.", "",
             "| pattern | prompt | prefilled | TTFT median (s) | min-max (s) | TTFT saved vs naive | s per 1K prefilled |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in timed:
        t = r["totals"]
        saved = f"{1 - t['ttft_s'] / naive['totals']['ttft_s']:.0%}" if naive and r is not naive else "-"
        per = 1000 * t["ttft_s"] / max(1, t["prefilled_tokens"])
        lines.append(f"| {r['pattern']} | {_n(t['prompt_tokens'])} | {_n(t['prefilled_tokens'])} | {t['ttft_s']:.2f} | "
                     f"{t.get('ttft_min', t['ttft_s']):.2f}-{t.get('ttft_max', t['ttft_s']):.2f} | {saved} | {per:.2f} |")  # fmt: skip
    order = sorted(timed, key=lambda r: r["totals"]["prefilled_tokens"])
    inv = [(a["pattern"], b["pattern"]) for a, b in zip(order, order[1:])
           if b["totals"]["ttft_max"] < a["totals"]["ttft_min"]]  # fmt: skip
    lines += [
        "",
        "Inversions (more prefill but a faster TTFT, outside the spread): "
        + (", ".join(f"`{b}` faster than `{a}`" for a, b in inv) if inv else "none."),
    ]
    if curve:
        lines += ["", "| context | cold median (s) | cold min-max | warm median (s) | warm min-max | cold / warm |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        lines += [f"| {c['context']:,} | {c['cold_median']:.2f} | {c['cold_min']:.2f}-{c['cold_max']:.2f} | "
                  f"{c['warm_median']:.2f} | {c['warm_min']:.2f}-{c['warm_max']:.2f} | {c['cold_median'] / c['warm_median']:.1f}x |"
                  for c in curve]  # fmt: skip
    return lines


def main_runs(runs: list[dict], page: int) -> list[dict]:
    """The runs of the per-workload tables and plots: cache on, the run's page size, default sessions, no
    sweep cells (the cache-off contrasts, Experiment 2-3 and the status sweep have their own sections)."""
    from kvreuse.benchmarks.patterns.sweep import SIZES

    sweep = {f"status_{m}_{n}" for n in SIZES for m in ("replace", "append")}
    return [r for r in runs if r.get("prefix_cache", "radix") == "radix" and r.get("page_size", page) == page
            and r.get("variant") != "quick" and r["pattern"] not in sweep]  # fmt: skip


def _label(c: dict) -> str:
    return f"{c['workload']}:{c['stack']}:{c['pattern']}" + (
        " (replies replayed)" if c.get("replies") == "replayed" else ""
    )


def write_report(results: dict, out: Path) -> Path:
    """Write report.md (verdicts first, then costs, tables, checks, TTFT, explanations), the PNG plots and
    report.html (the same, one self-contained page)."""
    from kvreuse.benchmarks.agents.report import section as real_agents
    from kvreuse.benchmarks.patterns.claims import verdicts
    from kvreuse.benchmarks.patterns.real_traffic import section as real_traffic
    from kvreuse.benchmarks.patterns.report_html import write_html
    from kvreuse.benchmarks.patterns.report_plots import all_plots
    from kvreuse.benchmarks.patterns.report_sections import agent_scale, claim_counts, exp23, sweep
    from kvreuse.benchmarks.patterns.scale import scale_table, summary, without_row
    from kvreuse.benchmarks.patterns.verdicts import number_rows
    from kvreuse.benchmarks.patterns.verdicts import table as verdict_table

    meta, all_runs, timed = results["meta"], results["runs"], results.get("timed", [])
    page = meta.get("page_size", 16)
    runs = main_runs(all_runs, page)
    # the stack shown in detail: the Qwen3 append-only one, or the only one that ran (e.g. a hybrid's own)
    main_stack = MAIN if any(r.get("stack") == MAIN for r in runs) or not runs else runs[0].get("stack")
    for r in all_runs + timed:
        r["page"] = r.get("page_size", page)
    pngs = all_plots({**results, "runs": runs}, out)
    vs = verdicts(all_runs)
    lines = ["# Context patterns: measured KV reuse (fourth edition)", "", *summary(all_runs), "",
             "## Verdicts", "",
             "One row per checkable claim of the seeds (`shared/seeds`: [000] a product's context guide, [001] an "
             "analysis of Claude Code's context, [003] a book chapter on context engineering), each with the seed "
             "and section it comes from, the runs it reads, the measured number and the rule that turns the number "
             "into the verdict. Cache claims are judged by their *cache effect*: the worse arm's prefill over the "
             "better arm's with the prefix cache on, divided by the same ratio with the prefix cache off (the same "
             "requests on an engine with `prefix_cache=\"off\"`), so prompt-size differences cancel. Verdicts are "
             "computed (`benchmarks/patterns/verdicts.py`, claims in `claims*.py`); none is written by hand.", "",
             *claim_counts(vs), "", *verdict_table(vs), *without_row(), *scale_table(all_runs), ""]  # fmt: skip
    if all(v.verdict == "not measurable here" for v in vs):
        lines = lines[: lines.index("## Verdicts") + 2]
        lines += [
            "(No claim's runs are in this report: the claims read the `qwen3-append` runs with their cache-off "
            "contrasts, which a --quick, filtered or single-model run does not have; they are judged in "
            "`benchmarks/results/patterns_default`.)",
            "",
        ]
    lines += _header(meta)
    checks = acceptance(runs, page)
    if checks:
        generic = [c for c in checks if c["check"] == "prefix_reused"]
        lines += ["", "## Checks (upper and lower bounds: a cache-off run fails them)", "",
                  f"- {sum(c['ok'] for c in generic)} of {len(generic)} runs PASS the generic bounds (every request "
                  "reuses all whole pages shared with its thread's previous request; none reuses more than the ideal)."]  # fmt: skip
        lines += [f"- {'PASS' if c['ok'] else 'FAIL'} `{_label(c)}`: {c['text']}."
                  for c in checks if (c["check"] != "prefix_reused" and c["stack"] == main_stack) or not c["ok"]]  # fmt: skip
    lines += snapshot_table(runs)
    engine_rows = [
        x for r in runs if r["cache"] and r.get("target", "in-process") == "in-process" for x in r["requests"]
    ]
    if engine_rows and any(r.get("target") == "accounting" for r in runs):
        same = sum(x["prefilled_tokens"] == x["ideal_paged_tokens"] for x in engine_rows)
        lines += [f"- The accounting rule used for the agent-scale session (whole pages of the longest prefix shared "
                  f"with an earlier prompt + reply) agrees with the engine on {same:,} of {len(engine_rows):,} "
                  "engine requests in this report."]  # fmt: skip
    if any(r["workload"] == "coding" for r in runs):
        lines += ["", "## Cost per session", "", *_cost(runs, main_stack)]
    lines += sweep(all_runs) + exp23(all_runs) + agent_scale(all_runs) + real_traffic()
    lines += real_agents()  # the kept recordings of the real agent CLIs (benchmarks/agents/report.py)
    old = [r for r in runs if r.get("replies") == "replayed"]
    if old:
        lines += ["", "## Cached vs replayed replies (coding, `qwen3-append`)", "",
                  "| pattern | prefilled, replies cached | prefilled, replies replayed |", "|---|---|---|"]  # fmt: skip
        for r in old:
            new = next((x for x in runs if (x["workload"], x.get("stack"), x["pattern"], x.get("replies"))
                        == (r["workload"], r["stack"], r["pattern"], "cached")), None)  # fmt: skip
            lines.append(f"| {r['pattern']} | {_n(new['totals']['prefilled_tokens']) if new else '-'} | "
                         f"{_n(r['totals']['prefilled_tokens'])} |")  # fmt: skip
    for w in dict.fromkeys(r["workload"] for r in runs):
        sel = [r for r in runs if r["workload"] == w and r.get("replies") == "cached"]
        lines += [
            "",
            f"## Workload `{w}` ({len(sel[0]['requests'])} requests): every stack",
            "",
            *(
                [
                    "Agent-scale session: a Claude Code-shaped coding session (see `benchmarks/workloads/agent.py`); "
                    "counts from the engine's accounting rule (checked against the engine above), not a model replay.",
                    "",
                ]
                if any(r.get("target") == "accounting" for r in sel)
                else []
            ),
            *_stack_table(runs, w),
        ]
        main = [r for r in sel if r["stack"] == main_stack]
        if main:
            naive = next((r["totals"]["prompt_tokens"] for r in main if r["pattern"] == "naive"), None)
            for r in main:
                r["naive_prompt"] = naive
            lines += ["", f"`{main_stack}` in detail:", "", *table(main), ""]
            lines += [f"- {explain(r)}" for r in main]
    lines += _timed(timed, results.get("curve", []))
    lines += ["", "## Plots", ""] + [f"![{p[:-4]}]({p})" for p in pngs] + [""]
    path = out / "report.md"
    path.write_text(number_rows("\n".join(lines), vs))  # notes name other rows by claim: {row:PREFIX}
    write_html(path)  # the same report as one offline page, plots embedded
    return path


MAIN = "qwen3-append"
