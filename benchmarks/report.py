"""Turn benchmark results into report.md, PNG plots and per-pattern explanations drawn from the numbers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.patterns.checks import acceptance


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


def plots(runs: list[dict], out: Path) -> list[str]:
    """Cumulative prefilled tokens, TTFT and context size per turn, reuse ratio bars; one PNG each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    files = []
    series = [
        ("cumulative_prefilled.png", "cumulative prefilled tokens", "prefilled_tokens", True),
        ("ttft.png", "TTFT (s)", "ttft_s", False),
        ("context_size.png", "prompt tokens", "prompt_tokens", False),
    ]
    names = list(dict.fromkeys(r["pattern"] for r in runs))
    cmap = plt.get_cmap("tab20")
    style = {
        n: {"color": cmap(i % 20), "linestyle": ("-", "--", ":", "-.")[i // 10 % 4]}
        for i, n in enumerate(names)
    }
    for fname, ylabel, key, cumulative in series:
        fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 6.5), squeeze=False)
        for ax, w in zip(axes[0], workloads, strict=True):
            for r in (r for r in runs if r["workload"] == w):
                ys = [row[key] if row[key] is not None else 0 for row in r["requests"]]
                if cumulative:
                    ys = [sum(ys[: i + 1]) for i in range(len(ys))]
                ax.plot(range(len(ys)), ys, marker=".", label=r["pattern"], **style[r["pattern"]])
            ap = next((r for r in runs if r["workload"] == w and r["pattern"] == "append_only"), None)
            if cumulative and ap:
                ideal = [row["ideal_tokens"] for row in ap["requests"]]
                cum = [sum(ideal[: i + 1]) for i in range(len(ideal))]
                ax.plot(range(len(ideal)), cum, "k", linewidth=3, alpha=0.3, label="ideal (append-only)")
            ax.set_title(f"workload: {w}")
            ax.set_xlabel("request (turn)")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.yaxis.set_major_formatter(
                matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 10 else f"{v:g}")
            )
            # below the axes: TTFT curves fill the whole plot area, so a legend inside would hide data
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, frameon=False)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=90)
        plt.close(fig)
        files.append(fname)
    sizes = [sum(r["workload"] == w for r in runs) for w in workloads]
    fig, axes = plt.subplots(
        len(workloads),
        1,
        figsize=(8, 1.2 + 0.4 * sum(sizes)),
        squeeze=False,
        height_ratios=[n + 1.5 for n in sizes],
    )
    for ax, w in zip(axes[:, 0], workloads, strict=True):
        sel = [r for r in runs if r["workload"] == w]
        ratios = [r["totals"]["reuse_ratio"] or 0 for r in sel]
        ax.barh([r["pattern"] for r in sel], ratios, color=[style[r["pattern"]]["color"] for r in sel])
        for y, v in enumerate(ratios):
            ax.text(min(v, 0.88) + 0.01, y, f"{100 * v:.0f}%", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_title(f"workload {w}: reuse ratio (cached / prompt tokens)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "reuse_ratio.png", dpi=90)
    plt.close(fig)
    return files + ["reuse_ratio.png"]


def write_report(results: dict, out: Path) -> Path:
    """Write report.md (tables, explanations, plot links) and the PNG plots into ``out``."""
    meta, runs = results["meta"], results["runs"]
    for r in runs:
        r["page"] = meta.get("page_size", 16)
    pngs = plots(runs, out)
    lines = ["# Context patterns: measured KV reuse", ""]
    lines.append(
        f"Target: {meta['target']} ({meta.get('model')}), template `{meta['template']}`, page size "
        f"{meta['page_size']}, {meta['max_tokens']} generated tokens per request (ignored; the next turn replays "
        f"the scripted reply), {'quick' if meta['quick'] else 'full' if meta.get('full') else 'default'} plan, {meta['wall_s']:.0f} s wall."
    )
    lines += ["", "*ideal*: tokens no earlier request (prompt or generated output) had computed, i.e. the floor",
              "for any prefix cache on these prompts. *distance to ideal*: prefilled minus ideal.", ""]  # fmt: skip
    notes = {r["reset_note"] for r in runs if r.get("reset_note")} | set(meta.get("notes", []))
    lines += [line for n in sorted(notes) for line in (f"> {n}", "")]
    checks = acceptance(runs, meta.get("page_size", 16))
    if checks:
        lines += ["", "## Acceptance checks", ""]
        lines += [
            f"- {'PASS' if c['ok'] else 'FAIL'} `{c['workload']}:{c['pattern']}`: {c['text']}."
            for c in checks
        ]
    if any(r["totals"].get("savings_basis") == "derived" for r in runs):
        lines += [
            "",
            "\\* naive did not run on this workload: its prefill is derived as every prompt token of the "
            "append-only requests (the prefix cache off computes them all; TTFT savings need the measured run).",
        ]
    for w in dict.fromkeys(r["workload"] for r in runs):
        sel = [r for r in runs if r["workload"] == w]
        lines += ["", f"## Workload `{w}` ({len(sel[0]['requests'])} requests)", ""] + table(sel) + [""]
        lines += [f"- {explain(r)}" for r in sel]
    lines += ["", "## Plots", ""] + [f"![{p[:-4]}]({p})" for p in pngs] + [""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
