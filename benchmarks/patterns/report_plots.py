"""The report's PNG plots: small multiples, prefill relative to the ideal, TTFT with spreads, labelled threads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MAIN = "qwen3-append"


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(n: int, cols: int = 4) -> tuple[int, int]:
    return max(1, -(-n // cols)), min(cols, max(1, n))


def reference_ideal(runs: list[dict]) -> dict[tuple, int]:
    """Per (workload, stack): the append-only session's ideal, i.e. each token of the conversation computed once."""
    return {(r["workload"], r.get("stack")): r["totals"]["ideal_tokens"] for r in runs
            if r["pattern"] == "append_only" and r.get("replies") == "cached"}  # fmt: skip


def prefill_vs_ideal(runs: list[dict], out: Path) -> str | None:
    """One panel per workload: prefilled / the append-only ideal per pattern, one bar per stack."""
    ref = reference_ideal(runs)
    sel = [r for r in runs if r.get("replies") == "cached" and ref.get((r["workload"], r.get("stack")))]
    if not sel:
        return None
    plt = _plt()
    workloads = list(dict.fromkeys(r["workload"] for r in sel))
    stacks = list(dict.fromkeys(r["stack"] for r in sel))
    heights = [len({r["pattern"] for r in sel if r["workload"] == w}) for w in workloads]
    fig, axes = plt.subplots(len(workloads), 1, figsize=(9, 1.0 + 0.42 * sum(heights) + 0.6 * len(workloads)),
                             squeeze=False, height_ratios=[h + 1.2 for h in heights])  # fmt: skip
    colors = {s: c for s, c in zip(stacks, ("tab:blue", "tab:orange", "tab:green", "tab:red"), strict=False)}
    for ax, w in zip(axes[:, 0], workloads, strict=True):
        pats = list(dict.fromkeys(r["pattern"] for r in sel if r["workload"] == w))
        width = 0.8 / len(stacks)
        for i, s in enumerate(stacks):
            for y, p in enumerate(pats):
                r = next((r for r in sel if (r["workload"], r["stack"], r["pattern"]) == (w, s, p)), None)
                if r is None:
                    continue
                v = r["totals"]["prefilled_tokens"] / ref[(w, s)]
                ax.barh(y + (i - (len(stacks) - 1) / 2) * width, v, height=width, color=colors[s],
                        label=s if y == 0 or p == pats[0] else None)  # fmt: skip
                ax.text(
                    v * 1.03, y + (i - (len(stacks) - 1) / 2) * width, f"{v:.1f}x", va="center", fontsize=6
                )
        ax.set_yticks(range(len(pats)), pats, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(ax.get_xlim()[1], 1.2) * 1.08)
        ax.axvline(1.0, color="k", linewidth=1)
        ax.set_title(
            f"{w}: prefilled / ideal of the append-only session (a reference, not a floor)", fontsize=9
        )
        ax.grid(axis="x", alpha=0.3, which="both")
        if w == workloads[0]:  # one legend: the later panels are short and it would cover their bars
            handles, labels = ax.get_legend_handles_labels()
            uniq = dict(zip(labels, handles, strict=False))
            ax.legend(uniq.values(), uniq.keys(), fontsize=7, loc="lower right")
    axes[-1, 0].set_xlabel("prefilled tokens / the append-only session's ideal (same stack)", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "prefill_vs_ideal.png", dpi=90)
    plt.close(fig)
    return "prefill_vs_ideal.png"


def cumulative(runs: list[dict], out: Path, workload: str, fname: str) -> str | None:
    """Small multiples for one workload (main stack): cumulative prefilled per turn vs the ideal and naive."""
    sel = [
        r
        for r in runs
        if r["workload"] == workload and r.get("stack") == MAIN and r.get("replies") == "cached"
    ]
    sel = [r for r in sel if r["cache"]]
    if not sel:
        return None
    ref = next((r for r in sel if r["pattern"] == "append_only"), sel[0])["requests"]
    # only sessions as long as the reference: a 16-request panel beside a 10-request reference misleads
    sel = [r for r in sel if len(r["requests"]) == len(ref)]
    plt = _plt()
    rows, cols = _grid(len(sel))
    fig, axes = plt.subplots(
        rows, cols, figsize=(3.3 * cols, 2.5 * rows), squeeze=False, sharex=True, sharey=True
    )
    naive = [sum(r["prompt_tokens"] for r in ref[: i + 1]) for i in range(len(ref))]
    ideal = [sum(r["ideal_tokens"] for r in ref[: i + 1]) for i in range(len(ref))]
    for ax, r in zip(axes.flat, sel, strict=False):
        pre = [row["prefilled_tokens"] for row in r["requests"]]
        xs = range(len(pre))
        ax.plot(range(len(ideal)), ideal, color="k", alpha=0.35, linewidth=3, label="ideal (append-only)")
        ax.plot(xs, [sum(pre[: i + 1]) for i in xs], color="tab:red", label="prefilled")
        ax.plot(range(len(naive)), naive, color="grey", linestyle=":", label="no cache (append-only prompts)")
        ax.set_title(r["pattern"], fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(sel) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(f"{workload} ({MAIN}): cumulative prefilled tokens per request", fontsize=10)
    fig.supxlabel("request", fontsize=8)
    fig.supylabel("cumulative tokens", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out / fname, dpi=80)
    plt.close(fig)
    return fname


def fanout_threads(runs: list[dict], out: Path) -> str | None:
    """Per-request prefilled vs cached tokens of the fan-out, each bar labelled with its thread."""
    sel = [r for r in runs if r["workload"] == "fanout" and r.get("stack") == MAIN and r["cache"]]
    if not sel:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(sel), figsize=(6 * len(sel), 3.6), squeeze=False, sharey=True)
    for ax, r in zip(axes[0], sel, strict=True):
        rows = r["requests"]
        xs = range(len(rows))
        ax.bar(xs, [x["cached_tokens"] for x in rows], color="tab:green", label="cached")
        ax.bar(xs, [x["prefilled_tokens"] for x in rows], bottom=[x["cached_tokens"] for x in rows],
               color="tab:red", label="prefilled")  # fmt: skip
        names = ["parent" if x["thread"] == 0 else f"sub {x['thread']}" for x in rows]
        ax.set_xticks(list(xs), names, rotation=60, fontsize=7)
        ax.set_title(f"fanout: {r['pattern']}", fontsize=9)
        ax.set_ylabel("prompt tokens")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "fanout_threads.png", dpi=85)
    plt.close(fig)
    return "fanout_threads.png"


def ttft(timed: list[dict], out: Path) -> str | None:
    """Small multiples: per-request TTFT median with its min-max spread, one panel per timed pattern."""
    if not timed:
        return None
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    rows, cols = _grid(len(timed))
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.6 * rows), squeeze=False, sharey=True)
    for ax, r in zip(axes.flat, timed, strict=False):
        med = [x["ttft_s"] for x in r["requests"]]
        lo = [x["ttft_s"] - x.get("ttft_min", x["ttft_s"]) for x in r["requests"]]
        hi = [x.get("ttft_max", x["ttft_s"]) - x["ttft_s"] for x in r["requests"]]
        ax.errorbar(range(len(med)), med, yerr=[lo, hi], marker="o", markersize=3, capsize=2)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # requests are whole
        ax.set_title(f"{r['pattern']} (total {r['totals']['ttft_s']:.1f}s)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in axes.flat[len(timed) :]:
        ax.axis("off")
    fig.suptitle(
        f"TTFT per request (s): median and min-max of {timed[0].get('rounds', 1)} interleaved rounds",
        fontsize=10,
    )
    fig.supxlabel("request index in the session", fontsize=8)
    fig.supylabel("time to first token (s)", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "ttft.png", dpi=85)
    plt.close(fig)
    return "ttft.png"


def ttft_curve(curve: list[dict], out: Path) -> str | None:
    if not curve:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    xs = [c["context"] for c in curve]
    for kind, color in (("cold", "tab:red"), ("warm", "tab:green")):
        med = [c[f"{kind}_median"] for c in curve]
        err = [[m - c[f"{kind}_min"] for m, c in zip(med, curve, strict=True)],
               [c[f"{kind}_max"] - m for m, c in zip(med, curve, strict=True)]]  # fmt: skip
        label = "cold (prefix cache empty)" if kind == "cold" else "warm (prefix cached, 64 new tokens)"
        ax.errorbar(xs, med, yerr=err, marker="o", capsize=3, color=color, label=label)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("TTFT (s)")
    ax.set_title("TTFT vs context length (median, min-max)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "ttft_curve.png", dpi=90)
    plt.close(fig)
    return "ttft_curve.png"


def all_plots(results: dict, out: Path) -> list[str]:
    runs = results["runs"]
    made = [
        prefill_vs_ideal(runs, out),
        cumulative(runs, out, "coding", "cumulative_coding.png"),
        cumulative(runs, out, "agent", "cumulative_agent.png"),
        fanout_threads(runs, out),
        ttft(results.get("timed", []), out),
        ttft_curve(results.get("curve", []), out),
    ]
    return [m for m in made if m]
