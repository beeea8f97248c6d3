"""Shared helpers for the engine benchmarks: CLI flags, interleaved timing, tables, JSON with machine info.

Timings on a shared CPU are noisy, so every benchmark measures its variants side by side in one
process, interleaves the repetitions (A B A B ...) and reports medians and ratios of medians.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def module_of(name: str) -> str:
    """The dotted module of benchmark ``name``, in whichever kind's sub-package (``serving/``, ...) it sits."""
    found = sorted(RESULTS_DIR.parent.glob(f"*/{name}.py"))
    return f"kvreuse.benchmarks.{found[0].parent.name}.{name}" if found else f"kvreuse.benchmarks.{name}"


def base_parser(name: str, description: str) -> argparse.ArgumentParser:
    """Flags every benchmark takes: ``--quick``, ``--out``, ``--threads``, ``--reps``."""
    p = argparse.ArgumentParser(prog=f"python -m {module_of(name)}", description=description)
    p.add_argument(
        "--quick", action="store_true", help="small sizes, one repetition: a correctness smoke run"
    )
    p.add_argument("--out", type=Path, default=RESULTS_DIR / f"{name}.json", help="JSON results path")
    p.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)"
    )
    p.add_argument("--reps", type=int, default=None, help="repetitions per variant (default: 3, --quick: 1)")
    return p


def apply_threads(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)


def reps(args: argparse.Namespace, default: int = 3) -> int:
    return args.reps or (1 if args.quick else default)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    """What the figures depend on: library versions, threads, CPU, load at the time of the run."""
    import transformers

    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "load_average": load,
        "platform": platform.platform(),
    }


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def interleave(
    variants: dict[str, Callable[[int], float]], n_reps: int, warmup: bool = False
) -> dict[str, list[float]]:
    """Run each variant once per round, in turn (A B A B ...); each call gets the round and returns seconds.

    With ``warmup``, one untimed round first (first calls pay for allocation and kernel selection); callers
    that warm up once with a small input pass False.
    """
    times: dict[str, list[float]] = {k: [] for k in variants}
    if warmup:
        for fn in variants.values():
            fn(-1)
    for r in range(n_reps):
        for name, fn in variants.items():
            times[name].append(fn(r))
            progress(f"{name} round {r}: {times[name][-1]:.3f} s")
    return times


def progress(msg: str) -> None:
    """A timestamped line on stderr so a long run shows where it is."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]."""
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (also readable in a terminal); floats get 3 significant-ish decimals."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        if isinstance(v, bool):
            return "yes" if v else "NO"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def shown_path(path: Path) -> str:
    """A path as committed results show it: relative to the repository (``../shared/...`` beside it), never
    this machine's absolute path."""
    return os.path.relpath(path.resolve(), RESULTS_DIR.parent.parent)


def write_results(path: Path, name: str, args: argparse.Namespace, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "quick": bool(args.quick),
        "args": {k: (shown_path(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": machine_info(),
        **results,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")


def bench_main(
    name: str,
    parse_args: Callable[[list[str] | None], argparse.Namespace],
    run: Callable[[argparse.Namespace], dict[str, Any]],
    argv: list[str] | None,
) -> int:
    """The CPU benchmarks' ``main``: parse flags, pin threads, run, write the JSON results."""
    args = parse_args(argv)
    apply_threads(args)
    write_results(args.out, name, args, run(args))
    return 0


def model_dir() -> Path:
    from kvreuse.runtime.loading.model_source import resolve_model

    return Path(resolve_model(None)[0])


def synthetic_prompt(n: int, seed: int, vocab_lo: int = 1000, vocab_hi: int = 40000) -> list[int]:
    """``n`` random ordinary-token ids; a new seed gives a prompt that shares nothing with earlier ones."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(vocab_lo, vocab_hi, (n,), generator=g).tolist()
