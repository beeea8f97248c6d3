"""Regenerate the committed workload data: ``python -m kvreuse.benchmarks.workloads.generate [--seed N] [--out DIR]``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvreuse.benchmarks.workloads import DATA_DIR, DEFAULT_SEED, VARIANTS, WORKLOADS
from kvreuse.benchmarks.workloads.agents import BUILDERS
from kvreuse.benchmarks.workloads.trajectory import Trajectory


def build(name: str, variant: str, seed: int = DEFAULT_SEED) -> Trajectory:
    """Build one trajectory; each workload gets its own sub-seed so they are independent."""
    sub_seed = seed * 31 + WORKLOADS.index(name)
    return BUILDERS[name](sub_seed, quick=variant == "quick")


def static_prefix_text(traj: Trajectory) -> str:
    """System prompt plus tool schemas as the chat template lays them out (one JSON object per line)."""
    return traj.system + "\n" + "\n".join(json.dumps(t, ensure_ascii=False) for t in traj.tools)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--out", type=Path, default=DATA_DIR)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in WORKLOADS:
        for variant in VARIANTS:
            traj = build(name, variant, args.seed)
            path = args.out / f"{name}.{variant}.json"
            path.write_text(traj.to_json(), encoding="utf-8")
            print(f"{path}: {len(traj.turns)} turns, {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
