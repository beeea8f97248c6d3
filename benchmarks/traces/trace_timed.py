"""A slice of a Mooncake-format trace replayed in time against ``kvreuse serve``, cache on vs off, by AIPerf.

Run from the repository root: ``python -m kvreuse.benchmarks.traces.trace_timed [--quick] [--trace PATH]``.

The load generator is NVIDIA's AIPerf (``aiperf profile --custom-dataset-type mooncake_trace
--fixed-schedule``: it builds each prompt from the trace's ``hash_ids``, equal ids giving equal
text, and sends each request at its timestamp), found with ``--aiperf`` (default: on ``PATH``
or ``/tmp/aiperf-venv/bin``; ``pip install aiperf`` in a venv of its own: it pins libraries the
runtime does not share).  The slice: the first ``--families`` conversations that start after the
middle of the trace, every turn of each (single-turn requests included), so later turns find
their earlier ones.  Lengths are divided by ``--unit`` (a 512-token block becomes ``512 / unit``
tokens) to fit the embedded model's 8K context and a CPU; the slice's timestamps are compressed
so that it lasts ``--load`` times what the machine needs to prefill all of it without a cache
(measured first, one request), i.e. the cache-off server runs near saturation.  Both servers run
the embedded model (fp32 on CPU) with the default pool, one after the other, in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from kvreuse.benchmarks.common import base_parser, bench_main, format_table, progress
from kvreuse.benchmarks.traces import mooncake
from kvreuse.runtime.loading.model_source import embedded_model_dir
from kvreuse.runtime.server.launcher import ServerProcess


def pick_slice(reqs: list[mooncake.TraceRequest], families: int) -> list[mooncake.TraceRequest]:
    """Every turn of the first ``families`` conversations that begin after the trace's midpoint."""
    mid = (reqs[0].timestamp_ms + reqs[-1].timestamp_ms) / 2
    seen: set[int] = set()
    chosen: set[int] = set()
    for r in reqs:
        root = r.hash_ids[0]
        if root not in seen and r.timestamp_ms >= mid and len(chosen) < families:
            chosen.add(root)
        seen.add(root)
    return [r for r in reqs if r.hash_ids[0] in chosen]


def write_slice(reqs: list[mooncake.TraceRequest], unit: int, duration_s: float, path: Path) -> None:
    """The slice as a Mooncake file: lengths / ``unit``, timestamps squeezed into ``duration_s``."""
    t0, span = reqs[0].timestamp_ms, (reqs[-1].timestamp_ms - reqs[0].timestamp_ms) or 1.0
    with path.open("w") as f:
        for r in reqs:
            n_in = max(1, -(-r.input_length // unit))
            row = {"timestamp": int((r.timestamp_ms - t0) / span * duration_s * 1000), "input_length": n_in,
                   "output_length": max(1, -(-r.output_length // unit)), "hash_ids": list(r.hash_ids)}  # fmt: skip
            f.write(json.dumps(row) + "\n")


def find_aiperf(hint: str | None) -> str:
    for cand in (hint, shutil.which("aiperf"), "/tmp/aiperf-venv/bin/aiperf"):
        if cand and Path(cand).exists():
            return cand
    raise SystemExit("aiperf not found: pip install aiperf into a venv and pass --aiperf PATH")


def prefill_rate(server: ServerProcess, model: str, tokens: int = 512) -> float:
    """Prompt tokens per second of one cold request (a prompt no cache holds)."""
    prompt = [(i * 7919) % 20000 + 100 for i in range(tokens)]
    t0 = time.perf_counter()
    r = httpx.post(f"{server.base_url}/completions", timeout=600,
                   json={"model": model, "prompt": prompt, "max_tokens": 1})  # fmt: skip
    r.raise_for_status()
    return tokens / (time.perf_counter() - t0)


TOKENIZER_REPO = "kvreuse/embedded-tokenizer"


def tokenizer_cache(root: Path) -> Path:
    """The embedded model's tokenizer laid out as an offline Hugging Face cache holding
    ``TOKENIZER_REPO``; returns the cache folder (``HF_HUB_CACHE``).  AIPerf 0.13 builds a trace's
    prompts in worker processes that load the tokenizer in offline mode as a cached hub repo: a local
    folder fails there (``HFValidationError``, a ``BrokenProcessPool`` once a slice has 10 requests)."""
    hub = root / "hub"
    repo = hub / f"models--{TOKENIZER_REPO.replace('/', '--')}"
    snap = repo / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True, exist_ok=True)
    for f in embedded_model_dir().iterdir():
        if f.suffix != ".safetensors" and not (snap / f.name).exists():
            shutil.copy(f, snap / f.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text("0" * 40)
    return hub


def run_aiperf(aiperf: str, server: ServerProcess, model: str, trace: Path, block: int, out: Path) -> dict:
    cmd = [aiperf, "profile", "--model", model, "--url", server.url, "--endpoint-type", "completions",
           "--streaming", "--input-file", str(trace), "--custom-dataset-type", "mooncake_trace", "--fixed-schedule",
           "--isl-block-size", str(block), "--tokenizer", TOKENIZER_REPO, "--ui", "none",
           "--artifact-dir", str(out), "--no-server-metrics", "--no-gpu-telemetry"]  # fmt: skip
    env = dict(os.environ, HF_HUB_CACHE=str(tokenizer_cache(out.parent)), HF_HUB_OFFLINE="1")
    done = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"aiperf exited with {done.returncode}:\n{done.stdout[-4000:]}")
    d = json.loads((out / "profile_export_aiperf.json").read_text())
    ttft = d["time_to_first_token"]
    return {"requests": d["request_count"]["avg"], "ttft_p50_s": ttft["p50"] / 1000, "ttft_p99_s": ttft["p99"] / 1000,
            "request_throughput": d["request_throughput"]["avg"],
            "input_token_throughput": d["total_isl"]["avg"] / d["benchmark_duration"]["avg"],
            "duration_s": d["benchmark_duration"]["avg"], "errors": d.get("error_summary") or []}  # fmt: skip


def serve(mode: str, log: Path) -> ServerProcess:
    return ServerProcess(["--prefix-cache", mode, "--served-model-name", "smollm2"], log).start(timeout=600)


def run(args: argparse.Namespace) -> dict:
    aiperf = find_aiperf(args.aiperf)
    reqs = pick_slice(mooncake.load(args.trace), 6 if args.quick else args.families)
    block = mooncake.BLOCK // args.unit
    prompt_tokens = sum(max(1, -(-r.input_length // args.unit)) for r in reqs)
    out: dict = {"slice_requests": len(reqs), "slice_prompt_tokens": prompt_tokens, "unit": args.unit,
                 "trace_span_s": (reqs[-1].timestamp_ms - reqs[0].timestamp_ms) / 1000}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        tmp_p = Path(tmp)
        results = {}
        for mode in ("off", "radix"):
            server = serve(mode, tmp_p / f"{mode}.log")
            try:
                if (
                    "replay_duration_s" not in out
                ):  # one time scale for both modes, from the cache-off server's prefill rate
                    rate = prefill_rate(server, "smollm2")
                    out["prefill_tokens_per_s"] = rate
                    out["replay_duration_s"] = args.load * prompt_tokens / rate
                    out["speedup"] = out["trace_span_s"] / out["replay_duration_s"]
                    write_slice(reqs, args.unit, out["replay_duration_s"], tmp_p / "slice.jsonl")
                progress(f"cache {mode}: {len(reqs)} requests over {out['replay_duration_s']:.0f} s")
                results[mode] = run_aiperf(
                    aiperf, server, "smollm2", tmp_p / "slice.jsonl", block, tmp_p / mode
                )
                results[mode]["engine"] = (
                    httpx.get(f"{server.url}/debug/kv", timeout=60).json().get("stats", {})
                )
            finally:
                server.stop()
    on, off = results["radix"], results["off"]
    out.update(results=results, ttft_p50_off_over_on=off["ttft_p50_s"] / on["ttft_p50_s"],
               ttft_p99_off_over_on=off["ttft_p99_s"] / on["ttft_p99_s"])  # fmt: skip
    print(format_table(["cache", "TTFT p50 s", "TTFT p99 s", "requests/s", "prompt tokens/s"],
                       [[m, r["ttft_p50_s"], r["ttft_p99_s"], r["request_throughput"], r["input_token_throughput"]]
                        for m, r in results.items()]))  # fmt: skip
    return {
        "dtype": "float32 (embedded model, CPU)",
        "threads": os.cpu_count(),
        "load_generator": "aiperf",
        **out,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("trace_timed", __doc__.split("\n")[0])
    p.add_argument("--trace", type=Path, default=mooncake.DEFAULT_TRACE, help="Mooncake-format .jsonl")
    p.add_argument("--unit", type=int, default=32, help="trace tokens per replayed token (default 32)")
    p.add_argument("--families", type=int, default=24, help="conversations in the slice (default 24)")
    p.add_argument(
        "--load", type=float, default=1.25, help="slice duration / cold prefill time (default 1.25)"
    )
    p.add_argument("--aiperf", default=None, help="path of the aiperf executable")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return bench_main("trace_timed", parse_args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
