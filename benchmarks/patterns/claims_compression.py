"""Claims about [003]'s five compression layers: their order (cheap and cache-gentle first), the
">75%" token reduction, identifiers kept verbatim, the circuit breaker."""

from __future__ import annotations

import re

from kvreuse.benchmarks.patterns.compression import LAYER_PATTERNS
from kvreuse.benchmarks.patterns.verdicts import MAIN, NOISE, Measured, NotMeasurable, Runs

S = "003 §生产级的分层压缩机制"
LAYERS = [n for n in LAYER_PATTERNS if n != "compress_layered"]
IDENT = re.compile(
    r"https?://[^\s\"')\]]+|\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b|\b[0-9a-f]{7,40}\b"
    r"|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{2,5})?\b|\b[\w.-]+/[\w./-]+\.\w{1,5}\b"
)


def _workload(R: Runs) -> str | None:
    """The longest session that ran every layer (agent in --full, else research)."""
    for w in ("agent", "research"):
        if all(
            R.get(w, p) is not None and R.get(w, p, cache="off") is not None
            for p in ["append_only", *LAYER_PATTERNS]
        ):
            return w
    return None


def layer_rows(R: Runs) -> list[tuple[str, float, float]] | None:
    """Per layer: (name, prompt-token reduction vs append-only, cache effect vs append-only)."""
    w = _workload(R)
    if w is None:
        return None
    ap, ap_off = R.get(w, "append_only"), R.get(w, "append_only", cache="off")
    out = []
    for p in LAYER_PATTERNS:
        on, off = R.get(w, p), R.get(w, p, cache="off")
        red = 1 - on["totals"]["prompt_tokens"] / ap["totals"]["prompt_tokens"]  # type: ignore[index]
        eff = (on["totals"]["prefilled_tokens"] / ap["totals"]["prefilled_tokens"]) / (  # type: ignore[index]
            off["totals"]["prefilled_tokens"] / ap_off["totals"]["prefilled_tokens"]  # type: ignore[index]
        )
        out.append((p, red, eff))
    return out


def _order(R: Runs) -> tuple[str, float, float] | None:
    rows = layer_rows(R)
    if rows is None:
        return None
    by = {p: (red, eff) for p, red, eff in rows}
    cheap, strong = LAYERS[:3], LAYERS[3:]
    pairs = [(c, s) for c in cheap for s in strong]
    # strict, beyond page granularity: with the cache off every effect is 1.0 and no pair is ordered
    ok = sum(by[c][1] * NOISE <= by[s][1] and by[c][0] < by[s][0] for c, s in pairs)
    num = "; ".join(
        f"`{p}` {red:.0%} fewer prompt tokens, cache effect {eff:.2f}x" for p, red, eff in rows if p in LAYERS
    )
    return (
        f"{_workload(R)}: {num}; {ok} of {len(pairs)} (cheap, strong) layer pairs ordered as claimed",
        ok,
        len(pairs),
    )


def _reduction(R: Runs) -> tuple[str, float, float] | None:
    rows = layer_rows(R)
    if rows is None:
        return None
    w = _workload(R)
    ap, st = R.get(w, "append_only"), R.get(w, "compress_layered")  # type: ignore[arg-type]
    first = ap["requests"][0]["prompt_tokens"]  # type: ignore[index]
    hist = lambda r: sum(x["prompt_tokens"] - first for x in r["requests"])  # noqa: E731
    red = 1 - st["totals"]["prompt_tokens"] / ap["totals"]["prompt_tokens"]  # type: ignore[index]
    red_h = 1 - hist(st) / max(1, hist(ap))
    return (f"{w}: all five layers send {red:.0%} fewer prompt tokens than append-only ({st['totals']['prompt_tokens']:,} "  # type: ignore[index]
            f"vs {ap['totals']['prompt_tokens']:,}); of the history past the first request, {red_h:.0%} fewer", red_h, 0.75)  # type: ignore[index]  # fmt: skip


def _identifiers(R: Runs) -> tuple[str, float, float] | None:
    w = _workload(R)
    if w is None:
        return None
    from kvreuse.benchmarks.patterns import PATTERNS
    from kvreuse.benchmarks.workloads import load

    # the pattern that made the run labelled compress_layered (its description is unique), so the text check
    # follows the runs: relabelled runs (the integrity test's swaps) are checked on what they really ran
    run = R.get(w, "compress_layered")
    pattern = next((p for p in PATTERNS.values() if run is not None and p.claim == run.get("claim")), None)
    if pattern is None:
        return None
    traj = pattern.prepare(load(w))
    last = max(k for k, t in enumerate(traj.turns) if t.thread == 0)
    full = " ".join(m.get("content") or "" for m in traj.history(last))
    req = pattern.build(traj, last)
    seen = " ".join(str(m.get("content") or "") for m in req.messages)
    ids = set(IDENT.findall(full))
    kept = {i for i in ids if i in seen}
    if len(seen) >= len(full):  # nothing was compressed: nothing to keep through compression
        return (
            f"{w}: `{pattern.name}` compressed nothing ({len(seen):,} vs {len(full):,} characters)",
            0.0,
            1.0,
        )
    return (f"{w}: {len(kept)} of {len(ids)} identifiers (paths, hashes, URLs, IPs) of the full history appear verbatim "
            f"in the last compressed request", len(kept) / max(1, len(ids)), 1.0)  # fmt: skip


LAYERED = (("research", "append_only", MAIN), ("research", "compress_layered", MAIN))

COMPRESSION_CLAIMS = [
    Measured("Compression layers: tool-result budget, noise deletion and micro-compaction disturb the cache less "
             "than archival and full summaries, which compress more", S, "compress_l1..l5 vs append_only", _order,
             "value: (cheap, strong) layer pairs where the strong layer's cache effect is >= 1.05x the cheap one's "
             "and its reduction larger; bound: all 6 pairs", "the first layers rewrite little of the prefix; summaries rewrite most",
             True, sides=tuple(("research", p, MAIN) for p in ["append_only", *LAYERS])),
    Measured("Context-aware compression cuts token use by more than 75%", "003 §对 Agent 架构设计的启示", "compress_layered",
             _reduction, "value: reduction of the history part of the prompt tokens (the static prefix cannot be "
             "compressed) with all five layers; bound 75%", "tool outputs dominate the history", sides=LAYERED),
    Measured("Identifiers (UUIDs, hashes, IPs, URLs, file names) stay verbatim through compression",
             "003 §压缩策略的设计原则", "compress_layered (text check)", _identifiers,
             "value: share of the full history's identifiers present verbatim in the compressed request; bound 100%",
             "previews and one-line records keep the identifiers they quote; whatever a cleared result held is gone "
             "unless a summary names it", sides=LAYERED),
    NotMeasurable("Full compaction's circuit breaker stops sessions stuck in repeated failed compactions", S,
                  "our deterministic summariser never fails (every attempt is shorter), so the breaker implemented in "
                  "`compression.py` never trips on these workloads (partly measurable: a summariser forced to fail "
                  "shows the breaker stop; the seed's claim is about real sessions: a real summariser's failure rate "
                  "over many sessions)"),
]  # fmt: skip
