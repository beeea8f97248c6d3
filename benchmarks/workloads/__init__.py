"""Deterministic agent trajectories: coding, research, sub-agent fan-out (stored as JSON data) and the
agent-scale session (``agent``: built on load from its seed, too large to commit usefully).

``load(name, variant)`` reads the committed data; ``python -m kvreuse.benchmarks.workloads.generate``
rebuilds it from the seeded builders in ``agents``.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvreuse.benchmarks.workloads.trajectory import Message, Trajectory, Turn

DATA_DIR = Path(__file__).parent / "data"
WORKLOADS = ("coding", "research", "fanout")  # stored as data
ALL_WORKLOADS = (*WORKLOADS, "agent")
VARIANTS = ("default", "quick")
DEFAULT_SEED = 20250914


def data_path(name: str, variant: str = "default") -> Path:
    return DATA_DIR / f"{name}.{variant}.json"


def load(name: str, variant: str = "default") -> Trajectory:
    """Load a committed trajectory; raises ValueError for unknown names or variants."""
    if name not in ALL_WORKLOADS or variant not in VARIANTS:
        raise ValueError(f"unknown workload {name!r}/{variant!r}; choose from {ALL_WORKLOADS} x {VARIANTS}")
    if name == "agent":
        from kvreuse.benchmarks.workloads.agent import agent

        return agent(DEFAULT_SEED * 31 + ALL_WORKLOADS.index(name), quick=variant == "quick")
    return Trajectory.from_dict(json.loads(data_path(name, variant).read_text(encoding="utf-8")))


__all__ = [
    "ALL_WORKLOADS",
    "DATA_DIR",
    "DEFAULT_SEED",
    "VARIANTS",
    "WORKLOADS",
    "Message",
    "Trajectory",
    "Turn",
    "data_path",
    "load",
]
