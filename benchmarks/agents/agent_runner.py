"""``kvreuse bench agents``: the real agent CLIs (Claude Code, Codex CLI; ``make agents``) on scripted
coding tasks against ``kvreuse serve``, every request recorded, analysed against the ideal reuse and
replayed through the pattern target with the cache on and off.

``kvreuse bench agents [--agents claude-code,codex] [--out benchmarks/results/agents] [--analyse-only]
[--free] [--server URL]``.  Figures of scripted runs are labelled "scripted" (the words of each reply come from the
script, every token goes through the engine).  ``--analyse-only`` re-reads the kept recordings (no node
needed); ``--free`` runs each agent once on the real Gemma 3 270M with its own replies instead.
``--server URL`` also replays each kept recording against that server, cache on and off
(``agents/replay_server.py``; a kvreuse server started as ``server_args`` says gives the live figures).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kvreuse.benchmarks.agents.session import AGENTS, PAGE

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "agents"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="kvreuse bench agents", description=__doc__.splitlines()[0])
    ap.add_argument("--agents", default=",".join(AGENTS), help=f"comma-separated, from {', '.join(AGENTS)}")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per agent task")
    ap.add_argument(
        "--analyse-only", action="store_true", help="re-analyse the kept recordings (no agent run)"
    )
    ap.add_argument("--no-replay", action="store_true", help="skip the cache-on/off replay")
    ap.add_argument(
        "--server", default=None, help="also replay the recordings against this server (cache on/off)"
    )
    ap.add_argument(
        "--free", action="store_true", help="the model's own replies (Gemma 3 270M), one task each"
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from kvreuse.benchmarks.agents.analyze import summary
    from kvreuse.benchmarks.agents.replay import replay
    from kvreuse.benchmarks.agents.session import installed, run_session

    args = parse_args(argv)
    names = [n.strip() for n in args.agents.split(",") if n.strip()]
    if unknown := set(names) - set(AGENTS):
        print(f"kvreuse bench agents: error: unknown agent(s) {', '.join(sorted(unknown))}")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.free:
        from kvreuse.benchmarks.agents.free import run_free

        result = {n: run_free(AGENTS[n], args.timeout) for n in names if installed(AGENTS[n])}
        (args.out / "free.json").write_text(json.dumps(result, indent=1))
        print(
            json.dumps(
                {n: {k: v for k, v in r.items() if k != "records"} for n, r in result.items()}, indent=1
            )
        )
        return 0
    summaries = {}
    for name in names:
        path = args.out / f"{name}.json"
        if not args.analyse_only:
            if installed(AGENTS[name]) is None:
                print(f"{name}: not installed (make agents): skipped")
                continue
            t0 = time.perf_counter()
            session = run_session(AGENTS[name], timeout_s=args.timeout)
            session["wall_s"] = round(time.perf_counter() - t0, 1)
            path.write_text(json.dumps(session, indent=None, ensure_ascii=False) + "\n")
        if not path.exists():
            continue
        session = json.loads(path.read_text())
        s = summary(session, PAGE)
        if not args.no_replay:
            s["replay"] = replay(session, PAGE)
        if args.server:
            from kvreuse.benchmarks.agents.replay_server import replay_server

            s["replay_server"] = rs = replay_server(session, args.server)
            print(f"{name} against {args.server}: cache on {rs['cache_on']['matches_live']} of "
                  f"{len(rs['cache_on']['rows'])} requests as live, prefilled {rs['cache_on']['prefilled_tokens']:,} "
                  f"(off {rs['cache_off']['prefilled_tokens']:,}), {rs['cache_on']['errors']} errors")  # fmt: skip
        summaries[name] = s
        print(f"{name} (scripted): {s['model_requests']} model requests, {s['cached_share']:.1%} of prompt tokens "
              f"cached (ideal {s['ideal_share']:.1%}), {s['breaks_over_a_page']} deficits over a page "
              f"({s['unexplained_breaks']} unexplained)")  # fmt: skip
    old = json.loads((args.out / "summary.json").read_text()) if (args.out / "summary.json").exists() else {}
    (args.out / "summary.json").write_text(
        json.dumps({**old, **summaries}, indent=1, ensure_ascii=False) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
