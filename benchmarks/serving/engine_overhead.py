"""Per-token engine overhead: a decode step's time minus its model forward, at 8 and 64 streams.

Run from the repository root: ``python -m kvreuse.benchmarks.serving.engine_overhead [--quick] [--against DIR]``.

Every stream's prompt is one shared ``--prompt-tokens`` prefix (cached once, so prefill is short) plus 16
tokens of its own; each generates ``--decode-tokens`` greedy tokens.  Over the steps where every stream
decodes, the step's wall time minus the model forward inside it (``CausalLM.forward``, timed by a wrapper:
on CPU ops are synchronous) is what the engine adds: scheduling, batch building, sampling, commit,
detokenisation and outputs.  Figures are medians per step, and per generated token (÷ streams).
``--model-dir`` runs a local model instead of the embedded one: a tiny random model with the real
vocabulary keeps the forward small and the sampling/detokenisation cost real, so a loaded machine
still finishes the measurement.

``--against DIR`` (another checkout, e.g. an older commit) runs the same measurement on both trees in
child processes, alternating rounds, so both see the same machine load; the JSON records both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def measure(
    streams: int, prompt_tokens: int, decode_tokens: int, model_dir: str | None, seed: int = 0
) -> dict:
    """One engine, ``streams`` decoding together; per-step overhead and forward seconds."""
    from kvreuse.benchmarks.common import median, synthetic_prompt
    from kvreuse.runtime import Engine, SamplingParams  # the public API: the same in trees of any layout

    eng = Engine(
        model_dir=model_dir, dtype="float32", device="cpu", kv_cache_memory="512M", max_running=streams,
        chunk_size=4096,
    )  # fmt: skip
    shared = synthetic_prompt(prompt_tokens, seed)
    eng.generate([shared + synthetic_prompt(16, seed + 1000)], SamplingParams(max_tokens=1, ignore_eos=True))
    model = eng.runner.model  # its forward is timed, to subtract it
    inner, forward_s = model.forward, []

    def timed_forward(*a, **k):
        t0 = time.perf_counter()
        out = inner(*a, **k)
        forward_s.append(time.perf_counter() - t0)
        return out

    model.forward = timed_forward
    params = SamplingParams(max_tokens=decode_tokens, ignore_eos=True)
    reqs = [eng.make_request(shared + synthetic_prompt(16, seed + 1 + i), params) for i in range(streams)]
    for req in reqs:
        eng.submit(req)
    ids = {req.request_id for req in reqs}
    started: set[str] = set()
    overhead, forward = [], []
    while eng.has_work():
        all_decoding = started == ids
        n_fw = len(forward_s)
        t0 = time.perf_counter()
        outs = eng.step()
        dt = time.perf_counter() - t0
        if any(o.finished for o in outs):
            all_decoding = False
        if all_decoding and len(forward_s) == n_fw + 1 and len(outs) == streams:
            overhead.append(dt - forward_s[-1])
            forward.append(forward_s[-1])
        started |= {o.request_id for o in outs}
    return {
        "streams": streams,
        "steps": len(overhead),
        "overhead_ms": 1e3 * median(overhead),
        "forward_ms": 1e3 * median(forward),
        "overhead_us_per_token": 1e6 * median(overhead) / streams,
        "overhead_share": median(overhead) / (median(overhead) + median(forward)),
    }


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads or 1)
    model = None if args.model_dir is None else str(args.model_dir)
    rows = [measure(n, args.prompt_tokens, args.decode_tokens, model) for n in args.streams]
    print("RESULT " + json.dumps(rows))


def run_tree(tree: Path, args: argparse.Namespace) -> list[dict]:
    cmd = [sys.executable, str(HERE), "--child", "--streams", ",".join(map(str, args.streams))]
    cmd += ["--prompt-tokens", str(args.prompt_tokens), "--decode-tokens", str(args.decode_tokens)]
    cmd += ["--threads", str(args.threads or 1)]
    cmd += ["--model-dir", str(args.model_dir.resolve())] if args.model_dir else []
    with tempfile.TemporaryDirectory() as stage:
        # the tree's folders as kvreuse.<folder>, ahead of this checkout's editable install on sys.path
        (Path(stage) / "kvreuse").mkdir()
        for folder in ("runtime", "kernels", "chat_templates", "benchmarks"):
            (Path(stage) / "kvreuse" / folder).symlink_to(tree / folder, target_is_directory=True)
        env = {**os.environ, "PYTHONPATH": stage}
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode or not line:
        raise RuntimeError(f"engine_overhead child in {tree} failed:\n{r.stderr[-2000:]}")
    return json.loads(line[-1][len("RESULT ") :])


def run(args: argparse.Namespace) -> dict:
    from kvreuse.benchmarks.common import format_table, median, progress, reps

    trees = {"this": HERE.parents[2]}
    if args.against:
        trees["against"] = args.against.resolve()
    samples: dict[str, list[list[dict]]] = {k: [] for k in trees}
    for r in range(reps(args, 2)):
        for name, tree in trees.items():  # alternate trees every round: same load for both
            samples[name].append(run_tree(tree, args))
            progress(
                f"round {r} {name}: "
                + ", ".join(f"{x['streams']}: {x['overhead_ms']:.2f} ms" for x in samples[name][-1])
            )
    summary, rows = {}, []
    for name in trees:
        summary[name] = []
        for i, n in enumerate(args.streams):
            per = [s[i] for s in samples[name]]
            row = {
                k: median([p[k] for p in per]) for k in ("overhead_ms", "forward_ms", "overhead_us_per_token")
            }
            summary[name].append({"streams": n, **row, "rounds": per})
            rows.append((name, n, row["forward_ms"], row["overhead_ms"], row["overhead_us_per_token"]))
    table = format_table(["tree", "streams", "forward ms", "overhead ms", "overhead us/token"], rows)
    print(table)
    out = {"trees": {k: str(v) for k, v in trees.items()}, "results": summary, "table": table,
           "load_avg": os.getloadavg()}  # fmt: skip
    if args.against:
        out["overhead_ratio_this_vs_against"] = {
            str(n): summary["this"][i]["overhead_ms"] / summary["against"][i]["overhead_ms"]
            for i, n in enumerate(args.streams)
        }
        print("overhead this / against:", out["overhead_ratio_this_vs_against"])
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from kvreuse.benchmarks.common import base_parser

    p = base_parser("engine_overhead", __doc__.splitlines()[0])
    p.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")], default=[8, 64])
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--decode-tokens", type=int, default=24)
    p.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="a local model (e.g. a tiny one: the overhead is the point)",
    )
    p.add_argument("--against", type=Path, default=None, help="another checkout to measure alongside")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.prompt_tokens, args.decode_tokens = 256, 8
    return args


def main(argv: list[str] | None = None) -> int:
    from kvreuse.benchmarks.common import bench_main

    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    return bench_main("engine_overhead", lambda _: args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
