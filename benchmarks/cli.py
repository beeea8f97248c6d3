"""``kvreuse bench NAME [options]``: dispatch to a benchmark module's ``main(argv)``."""

from __future__ import annotations

import importlib
import sys

BENCHES = {
    "patterns": (
        "kvreuse.benchmarks.patterns.pattern_runner",
        "context-management patterns report (the main job)",
    ),
    "agents": (
        "kvreuse.benchmarks.agents.agent_runner",
        "real agent CLIs (Claude Code, Codex) on kvreuse serve, recorded",
    ),
    "throughput": ("kvreuse.benchmarks.serving.throughput", "prefill/decode tokens/s vs transformers"),
    "ttft": ("kvreuse.benchmarks.serving.ttft_multiturn", "multi-turn TTFT, prefix cache on vs off"),
    "batching": (
        "kvreuse.benchmarks.serving.batching",
        "continuous batching throughput and chunked-prefill latency",
    ),
    "overhead": ("kvreuse.benchmarks.serving.engine_overhead", "per-token engine overhead, 8 and 64 streams"),
    "page-size": ("kvreuse.benchmarks.kernels.page_size", "page size trade-offs"),
    "kernels": ("kvreuse.benchmarks.kernels.kernel_bench", "Triton vs reference attention kernels (GPU)"),
    "gpu": ("kvreuse.benchmarks.kernels.gpu_bench", "real-size Qwen3 architectures on a GPU"),
}


def main(argv: list[str]) -> int:
    """benchmarks: `kvreuse bench patterns [--quick]` (`kvreuse bench` lists them)"""
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHES:
        print("usage: kvreuse bench NAME [options]   (NAME --help for its options)\n", file=sys.stderr)
        for name, (_, what) in BENCHES.items():
            print(f"  {name:<11} {what}", file=sys.stderr)
        if argv and argv[0] not in ("-h", "--help"):
            print(f"kvreuse: error: unknown benchmark {argv[0]!r}", file=sys.stderr)
            return 2
        return 0 if argv else 2
    module = importlib.import_module(BENCHES[argv[0]][0])
    return int(module.main(argv[1:]) or 0)
