"""Real agents' recorded traffic as evidence beside the synthetic patterns (a hook: it reads
``benchmarks/results/agents/`` when that folder holds recordings, and adds nothing when it does not).

Where a recording gives per-request rows with the server's counts (``prompt_tokens``, ``cached_tokens``
and, from the agents' analysis, ``ideal_cached``: the previous request's whole sequence in whole pages),
it judges the claim that decides every other one, "an append-only agent reuses everything", on real
traffic: the share of requests that got their ideal, and the share of prompt tokens read from the cache.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).resolve().parents[1] / "results" / "agents"
PAGE = 16  # the server's page size in the recordings' analysis


def _analysed(session: dict, page: int) -> list[dict] | None:
    """A raw recording's rows through the agents' own analysis (``benchmarks/agents/analyze.py``, the agents
    issue's module: absent on a branch without it), main-loop requests only."""
    try:
        from kvreuse.benchmarks.agents.analyze import rows
    except ImportError:
        return None
    return [r for r in rows(session["records"], page) if r.get("kind") != "side"]


def _sessions(node: Any, name: str, page: int = PAGE) -> list[tuple[str, list[dict]]]:
    """Every list of request rows in a recording's JSON, with a name from its nearest ``agent``/``name``."""
    if isinstance(node, dict):
        name = str(node.get("agent") or node.get("name") or name)
        if isinstance(node.get("records"), list) and (got := _analysed(node, page)):
            return [(name, got)]
        rows = node.get("rows")
        if (
            isinstance(rows, list)
            and rows
            and all(isinstance(r, dict) and "cached_tokens" in r for r in rows)
        ):
            return [(name, [r for r in rows if r.get("kind") != "side"])]
        return [s for v in node.values() for s in _sessions(v, name, page)]
    if isinstance(node, list):
        return [s for v in node for s in _sessions(v, name, page)]
    return []


def sessions(folder: Path = FOLDER) -> list[tuple[str, list[dict]]]:
    if not folder.is_dir():
        return []
    out: dict[str, list[dict]] = {}
    for f in sorted(folder.glob("*.json")):
        try:
            found = _sessions(json.loads(f.read_text()), f.stem)
        except (OSError, ValueError):
            continue  # not a recording this hook understands
        for name, rows in found:  # a raw recording and its summary name the same session: one row each
            out.setdefault(name, rows)
    return list(out.items())


def section(folder: Path = FOLDER) -> list[str]:
    found = sessions(folder)
    if not found:
        return []
    lines = ["", "## Real agents' traffic (recordings under `benchmarks/results/agents/`)", "",
             "Each recorded session through the kvreuse server: requests that reused their ideal (the previous "
             "request's whole sequence, in whole pages; side requests left out), what they fell short of it by, and "
             "the share of prompt tokens read from the cache. It judges row 1's claim (an append-only context reuses "
             "everything) on real traffic: confirmed when the cache delivered >= 99% of the ideal's tokens, partly at "
             ">= 90%, else refuted.", "",
             "| session | requests | within a page of the ideal | tokens short of the ideal | prompt tokens cached | verdict |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for name, rows in found:
        with_ideal = [r for r in rows if "ideal_cached" in r]
        ok = sum(
            r["cached_tokens"] >= r["ideal_cached"] - PAGE for r in with_ideal
        )  # within a page: granularity
        short = sum(max(0, r["ideal_cached"] - r["cached_tokens"]) for r in with_ideal)
        prompt = sum(r.get("prompt_tokens", 0) for r in rows)
        cached = sum(r["cached_tokens"] for r in rows)
        n = len(with_ideal)
        ideal = sum(r["ideal_cached"] for r in with_ideal)
        got = 1 - short / ideal if ideal else 0.0
        verdict = "-" if not n else "confirmed" if got >= 0.99 else "partly" if got >= 0.9 else "refuted"
        lines.append(f"| {name} | {len(rows)} | {ok} of {n} | {short:,} ({got:.1%} of the ideal reached) | {cached:,} / {prompt:,} ({cached / max(1, prompt):.0%}) | "
                     f"{verdict} |")  # fmt: skip
    return lines
