"""The disk tier: a restart that keeps the cache, and a working set larger than the pool.

Run from the repository root: ``python -m kvreuse.benchmarks.serving.kv_tiers [--quick] [--out PATH] [--threads N]``.

* **restart**: a 10-turn conversation (system prompt, then user/assistant turns; about 8K tokens of
  context by the last turn) sent as chat requests to a real ``kvreuse serve --kv-store``, in two
  shapes: ``chat`` (1.5K-token system prompt, 630 tokens a turn) and ``agent`` (4.8K tokens of system
  prompt and tool schemas, 300 tokens a step).  After turn 5 the server gets SIGTERM (it persists
  its cache) and a new server starts on the same store and serves turns 6-10; turn 6's TTFT is
  compared with the same prompt on a cold server (no store) and on a server that still holds turns
  1-5 in its pool (the ceiling: what a free restore would give), in the same run.  The KV restore
  rate is bytes loaded from disk / (background read-ahead + the engine's load time), from
  ``/debug/kv``.
* **eviction**: ``--sessions`` conversations round-robin over a pool that holds a quarter of their
  combined context, each turn appending to its session; the same trace on an engine with and
  without the disk tier (in one process, alternating sessions): token hit rate and TTFT.

Each request generates one token (TTFT is what is measured).  Targets: restart >= 5x faster than cold.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

from kvreuse.benchmarks.common import base_parser, bench_main, format_table, median, progress, reps
from kvreuse.benchmarks.serving.ttft_multiturn import _text

RESTART_TARGET = 5.0
LLAMA_CPP_SLOT_RESTORE_MBPS = 14.3 / 0.043  # 1,745-token slot, 14.3 MB restored in 43 ms (llama.cpp server)


def conversation(tokenizer, turns: int, seed: int, system_tokens: int, new_tokens: int) -> list[list[dict]]:
    """The messages of each turn's request; each extends the previous turn's (append-only)."""
    rng = random.Random(seed)
    messages = [{"role": "system", "content": _text(rng, tokenizer, system_tokens)}]
    out = []
    for t in range(turns):
        if t:
            messages.append({"role": "assistant", "content": _text(rng, tokenizer, int(new_tokens * 0.5))})
        messages.append(
            {
                "role": "user",
                "content": _text(rng, tokenizer, new_tokens if t == 0 else int(new_tokens * 0.5)),
            }
        )
        out.append([dict(m) for m in messages])
    return out


def _chat(url: str, messages: list[dict]) -> tuple[float, dict]:
    body = {"messages": messages, "max_tokens": 1, "temperature": 0}
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=900)
    dt = time.perf_counter() - t0
    r.raise_for_status()
    return dt, r.json()


def _stats(url: str) -> dict:
    return httpx.get(f"{url}/debug/kv", timeout=60).json()["stats"]


# Two conversation shapes that reach ~8K tokens by turn 10: (system prompt tokens, tokens a turn adds)
SHAPES = {"chat": (1500, 630), "agent": (4800, 300)}  # turn 10: ~8.0K of the model's 8,192


def restart(args: argparse.Namespace, workdir: Path, shape: str) -> dict:
    """Turns 1..R on a server with a store, SIGTERM, a new server on that store for turns R+1..N;
    turn R+1's TTFT against the same prompt on a cold server and on one that still has turns 1..R
    in its pool (the best a store can do), same run."""
    from kvreuse.benchmarks.common import model_dir
    from kvreuse.runtime.loading.tokenizer import load_tokenizer
    from kvreuse.runtime.server.launcher import ServerProcess

    system, new = SHAPES[shape] if not args.quick else (args.system_tokens, args.new_tokens)
    turns = conversation(load_tokenizer(model_dir()), args.turns, args.seed, system, new)
    at = args.restart_after
    flags = ["--dtype", "float32", "--kv-cache-memory", "1G"]
    rounds = []
    for r in range(reps(args, 2)):
        store = workdir / f"{shape}-store-{r}"
        srv = ServerProcess([*flags, "--kv-store", str(store)], workdir / f"warm-{r}.log").start()
        for t in range(at):
            dt, body = _chat(srv.url, turns[t])
            progress(f"{shape} round {r} turn {t + 1}: {body['usage']['prompt_tokens']} tokens, {dt:.2f} s")
        code = srv.terminate()
        t0 = time.perf_counter()
        srv = ServerProcess([*flags, "--kv-store", str(store)], workdir / f"restarted-{r}.log").start()
        start_s = time.perf_counter() - t0
        warm_s, warm = _chat(srv.url, turns[at])
        st = _stats(srv.url)
        later = [_chat(srv.url, turns[t]) for t in range(at + 1, args.turns)]  # the conversation goes on
        last_prompt = later[-1][1]["usage"]["prompt_tokens"] if later else None
        srv.terminate()
        cold_srv = ServerProcess(flags, workdir / f"cold-{r}.log").start()
        cold_s, cold = _chat(cold_srv.url, turns[at])
        cold_srv.terminate()
        pool_srv = ServerProcess(flags, workdir / f"pool-{r}.log").start()
        for t in range(at):
            _chat(pool_srv.url, turns[t])
        pool_s, _ = _chat(pool_srv.url, turns[at])
        pool_srv.terminate()
        usage = warm["usage"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        mb = st["disk_loaded_tokens"] * args.kv_bytes_per_token / 1e6
        restore_s = st["tier_load_s"] + st.get("tier_read_ahead_s", 0.0)
        rounds.append({
            "sigterm_exit_code": code, "restart_s": start_s, "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": cached, "disk_loaded_tokens": st["disk_loaded_tokens"], "restored_mb": mb,
            "load_s": st["tier_load_s"], "read_ahead_s": st.get("tier_read_ahead_s", 0.0), "restore_s": restore_s,
            "ttft_restarted_s": warm_s, "ttft_cold_s": cold_s, "ttft_in_pool_s": pool_s,
            "ttft_later_turns_s": [dt for dt, _ in later], "last_turn_prompt_tokens": last_prompt,
            "cold_cached_tokens": cold["usage"]["prompt_tokens_details"]["cached_tokens"],
            "same_token": warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"],
        })  # fmt: skip
        progress(f"{shape} round {r}: turn {at + 1} restarted {warm_s:.2f} s ({cached} cached) vs cold "
                 f"{cold_s:.2f} s vs in pool {pool_s:.2f} s")  # fmt: skip
    med = {k: median([x[k] for x in rounds]) for k in ("ttft_restarted_s", "ttft_cold_s", "ttft_in_pool_s")}
    mbps = median([x["restored_mb"] / x["restore_s"] for x in rounds if x["restore_s"] > 0] or [0.0])
    return {
        "shape": shape, "system_tokens": system, "tokens_per_turn": new, "rounds": rounds, **med,
        "speedup": med["ttft_cold_s"] / med["ttft_restarted_s"],
        "ceiling": med["ttft_cold_s"] / med["ttft_in_pool_s"],  # what a free restore would give
        "restore_mb_per_s": mbps, "llama_cpp_slot_restore_mb_per_s": LLAMA_CPP_SLOT_RESTORE_MBPS,
        "target_met": med["ttft_cold_s"] / med["ttft_restarted_s"] >= RESTART_TARGET,
    }  # fmt: skip


def eviction(args: argparse.Namespace, workdir: Path) -> dict:
    from kvreuse.chat_templates import render
    from kvreuse.runtime.engine.engine import Engine
    from kvreuse.runtime.sampling.params import SamplingParams

    params = SamplingParams(max_tokens=1, ignore_eos=True)
    probe = Engine(dtype="float32", num_pages=8)
    sessions = [
        conversation(probe.tokenizer, args.evict_turns, 100 + s, args.evict_system, args.evict_new)
        for s in range(args.sessions)
    ]
    prompts = [[render(probe.tokenizer, m).token_ids for m in sess] for sess in sessions]
    working = sum(len(p[-1]) for p in prompts)
    pool_pages = max(working // 4 // 16, max(len(p[-1]) for p in prompts) // 16 + 4)
    del probe
    engines = {
        "pool only": Engine(dtype="float32", num_pages=pool_pages),
        "pool + disk": Engine(dtype="float32", num_pages=pool_pages, kv_store=str(workdir / "evict-store")),
    }
    res = {k: {"prompt": 0, "cached": 0, "ttft": []} for k in engines}
    for t in range(args.evict_turns):
        for s in range(args.sessions):
            for name, eng in engines.items():
                out = eng.generate([prompts[s][t]], params)[0]
                d = res[name]
                d["prompt"] += out.prompt_tokens
                d["cached"] += out.cached_tokens
                d["ttft"].append(out.ttft_s)
        progress(
            f"eviction turn {t + 1}: "
            + ", ".join(f"{k} hit {v['cached'] / v['prompt']:.1%}" for k, v in res.items())
        )
    engines["pool + disk"].close()
    out = {"sessions": args.sessions, "turns": args.evict_turns, "working_set_tokens": working,
           "pool_tokens": pool_pages * 16}  # fmt: skip
    for name, d in res.items():
        out[name] = {"token_hit_rate": d["cached"] / d["prompt"], "ttft_median_s": median(d["ttft"]),
                     "ttft_total_s": sum(d["ttft"]), "prompt_tokens": d["prompt"], "cached_tokens": d["cached"]}  # fmt: skip
    return out


def run(args: argparse.Namespace) -> dict:
    from kvreuse.benchmarks.common import model_dir
    from kvreuse.runtime.models.config import ModelConfig

    args.kv_bytes_per_token = ModelConfig.from_dir(model_dir()).kv_bytes_per_token(4)
    workdir = Path(tempfile.mkdtemp(prefix="kvreuse-tiers-"))
    try:
        shapes = ["quick"] if args.quick else [x.strip() for x in args.shapes.split(",")]
        rs = {shape: restart(args, workdir, shape) for shape in shapes}
        ev = eviction(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rows = [
        (f"{k}: turn {args.restart_after + 1} ({r['rounds'][0]['prompt_tokens']} tokens)", r["ttft_restarted_s"],
         r["ttft_in_pool_s"], r["ttft_cold_s"], r["speedup"], r["ceiling"], r["restore_mb_per_s"])
        for k, r in rs.items()
    ]  # fmt: skip
    table = format_table(
        ["conversation", "TTFT restarted s", "TTFT in pool s", "TTFT cold s", "cold / restarted",
         "cold / in pool", "restore MB/s"], rows,
    )  # fmt: skip
    etable = format_table(
        ["engine", "token hit rate", "TTFT median s", "TTFT total s"],
        [
            (k, ev[k]["token_hit_rate"], ev[k]["ttft_median_s"], ev[k]["ttft_total_s"])
            for k in ("pool only", "pool + disk")
        ],
    )
    summary = (
        "; ".join(
            f"{k} restart: {r['speedup']:.1f}x faster than cold (target >= {RESTART_TARGET}x: "
            f"{'met' if r['target_met'] else 'NOT met'}; a free restore would give {r['ceiling']:.1f}x), KV restored "
            f"at {r['restore_mb_per_s']:.0f} MB/s"
            for k, r in rs.items()
        )
        + f" (llama.cpp slot restore: {LLAMA_CPP_SLOT_RESTORE_MBPS:.0f} MB/s)"
    )
    print(table, etable, summary, sep="\n\n")
    return {"restart": rs, "eviction": ev, "table": table, "eviction_table": etable, "summary": summary}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("kv_tiers", __doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--restart-after", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shapes", default="chat,agent", help=f"conversation shapes from {sorted(SHAPES)}")
    p.add_argument(
        "--system-tokens", type=int, default=200, help="--quick only (the shapes fix it otherwise)"
    )
    p.add_argument("--new-tokens", type=int, default=100, help="--quick only: tokens a turn adds")
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--evict-turns", type=int, default=3)
    p.add_argument("--evict-system", type=int, default=300)
    p.add_argument("--evict-new", type=int, default=200)
    args = p.parse_args(argv)
    if args.quick:
        args.turns, args.restart_after = 3, 2
        args.sessions, args.evict_turns, args.evict_system, args.evict_new = 4, 2, 60, 40
    return args


def main(argv: list[str] | None = None) -> int:
    return bench_main("kv_tiers", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
