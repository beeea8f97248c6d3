"""Sliding-window models: KV memory at 8K context against a full-attention twin, and prefix reuse over a
10-turn tool-using session (issue #30).

Run from the repository root: ``python -m kvreuse.benchmarks.kernels.window_paging [--quick] [--threads N]`` (fp32, CPU).

Models: random-weight checkpoints of transformers' own classes (the embedded SmolLM2 tokenizer, window
512): ``gemma3`` (5 sliding layers per full one, as Gemma 3), its ``twin`` (the same with every layer
full attention), ``gemma4`` (Gemma 4's 5:1 pattern, its full layers' own head shape, KV-shared last
layers) and its ``gemma4-twin``, ``ministral`` (sliding and full alternating) and ``mistral`` (every layer windowed:
its KV stays in pool pages).  Token counts do not depend on the weights' values.

* memory: one 8K-token prompt; the KV bytes it holds: pool pages (``tree_pages`` after it ends) times
  the page's bytes, plus the one window ring it ran in and the window snapshots kept; per context
  token (the rings of all ``max_running`` = 4 slots are allocated up front: ``rings_allocated_bytes``);
* session: each turn is the previous request's tokens (prompt + output) + Gemma's turn glue around a
  tool result of 60-900 tokens (some longer than the window) + the generation prompt; ``ideal`` is
  what was never computed before (prompt - previous tokens + 1: the previous request never computes
  its last sampled token).  With the cache off every turn would prefill its whole prompt (``prompt``);
* same turn: a prompt computed, then the same prompt with a tool result appended (vLLM #57610);
* llama.cpp (optional, ``--llamacpp-python`` with ``--llamacpp-module`` and/or ``--llamacpp-lib``; setup in
  ``benchmarks/README.md``): the ``gemma3`` checkpoint converted by llama.cpp's ``convert_hf_to_gguf.py``
  (``--llamacpp-src``), the gemma3 session's and same turn's requests replayed on the same token ids the
  way llama-server keeps a slot's context with its default settings: tokens evaluated per request, and
  whether it fell back to re-processing the whole prompt.  ``--llamacpp-module``: the ``llama-cpp-cffi``
  build (``llamacpp_session_side.py``); ``--llamacpp-lib``: llama.cpp 0.5.0's ``libllama``
  (``llamacpp_swa_side.py``), with the server's default 4 slots and with ``-np 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from kvreuse.benchmarks.common import base_parser, bench_main, format_table, progress

WINDOW = 512
BASE = dict(
    hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    vocab_size=49152, max_position_embeddings=16384, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    sliding_window=WINDOW,
)  # fmt: skip
SLIDE, FULL = "sliding_attention", "full_attention"
GEMMA4 = dict(
    num_hidden_layers=12, global_head_dim=128, num_global_key_value_heads=1, attention_k_eq_v=True,
    hidden_size_per_layer_input=32, vocab_size_per_layer_input=49152, num_kv_shared_layers=4,
)  # fmt: skip
MODELS = {
    "gemma3": ("gemma3_text", dict(num_hidden_layers=6, layer_types=[SLIDE] * 5 + [FULL])),
    "twin": ("gemma3_text", dict(num_hidden_layers=6, layer_types=[FULL] * 6)),
    # Gemma 4's shape: full layers of twice the head size with one KV head used as k and v, per-layer
    # inputs, the last full and sliding layers reading earlier layers' KV (no KV of their own)
    "gemma4": ("gemma4_text", dict(GEMMA4, layer_types=([SLIDE] * 5 + [FULL]) * 2)),
    "gemma4-twin": ("gemma4_text", dict(GEMMA4, layer_types=[FULL] * 12)),
    "ministral": ("ministral", dict(num_hidden_layers=4, layer_types=[SLIDE, FULL] * 2)),
    "mistral": ("mistral", dict(num_hidden_layers=4)),
}
GLUE_OPEN, GLUE_CLOSE = "<end_of_turn>\n<start_of_turn>user\n", "<end_of_turn>\n<start_of_turn>model\n"


def model_path(name: str) -> Path:
    """The random checkpoint for ``name``, written once under the kvreuse cache."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from kvreuse.runtime.loading.model_source import cache_dir, resolve_model

    out = cache_dir() / "bench" / f"window-{name}"
    if (out / ".complete").is_file():
        return out
    arch, kw = MODELS[name]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **BASE, **kw), dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    src = resolve_model(None)[0]
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, out / f)
    (out / ".complete").touch()
    return out


def engine(name: str, **kw):
    from kvreuse.runtime.engine.engine import Engine

    opts = dict(
        dtype="float32", device="cpu", page_size=16, chunk_size=512, kv_cache_memory="1G", max_running=4
    )
    return Engine(model_dir=str(model_path(name)), **{**opts, **kw})


def run_one(eng, prompt: list[int], max_tokens: int):
    from kvreuse.runtime.sampling.params import SamplingParams

    req = eng.make_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    eng.submit(req)
    while eng.has_work():
        eng.step()
    return req


def memory_at(name: str, context: int) -> dict:
    """KV bytes one ``context``-token prompt holds in ``name``'s pool, rings and snapshots."""
    from kvreuse.benchmarks.common import synthetic_prompt

    eng = engine(name)
    run_one(eng, synthetic_prompt(context, seed=1), 1)
    st = eng.stats()
    runner = eng.runner
    rings = runner.state_pool.nbytes  # every running-request slot's ring (max_running of them; 0 in pages)
    ring = rings // max(1, runner.state_pool.num_slots)  # the one this request used
    pages = st.tree_pages
    pool = pages * runner.pool.bytes_per_page
    snaps = st.snapshot_bytes
    total = pool + ring + snaps
    return {
        "model": name, "context": context, "pool_pages": pages, "page_bytes": runner.pool.bytes_per_page,
        "pool_bytes": pool, "ring_bytes": ring, "rings_allocated_bytes": rings, "snapshot_bytes": snaps,
        "bytes_per_token": total / context,
    }  # fmt: skip


def session(name: str, turns: int, seed: int, log: list | None = None, **kw) -> list[dict]:
    """The 10-turn tool session on one engine: per turn prompt, cached, prefilled, ideal; each request's
    prompt and reply ids appended to ``log`` (for llama.cpp's replay)."""
    from kvreuse.benchmarks.common import synthetic_prompt

    eng = engine(name, **kw)
    tok = eng.tokenizer
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    g = torch.Generator().manual_seed(seed)
    prompt = synthetic_prompt(700, seed) + enc("<start_of_turn>model\n")
    computed, rows = 0, []
    for t in range(turns):
        req = run_one(eng, prompt, 24)
        ideal = len(prompt) - computed
        rows.append(dict(turn=t, prompt=len(prompt), cached=req.cached_tokens, prefilled=req.prefilled_tokens,
                         ideal=ideal, snapshot_cut=req.snapshot_cut))  # fmt: skip
        if log is not None:
            log.append({"prompt": prompt, "reply": req.output_ids})
        tool = synthetic_prompt(int(torch.randint(60, 900, (1,), generator=g)), seed * 100 + t)
        computed = len(req.tokens) - 1
        prompt = list(req.tokens) + enc(GLUE_OPEN) + tool + enc(GLUE_CLOSE)
    return rows


def same_turn(name: str, log: list | None = None) -> dict:
    """A prompt computed, then the same prompt with a tool result appended before any output is kept."""
    from kvreuse.benchmarks.common import synthetic_prompt

    eng = engine(name)
    first = synthetic_prompt(1500, 7)
    r0 = run_one(eng, first, 4)
    longer = first + synthetic_prompt(300, 8)
    req = run_one(eng, longer, 4)
    if log is not None:
        log += [{"prompt": r.prompt_ids, "reply": r.output_ids} for r in (r0, req)]
    return dict(model=name, first=len(first), prompt=len(longer), cached=req.cached_tokens,
                prefilled=req.prefilled_tokens, ideal=len(longer) - len(first))  # fmt: skip


def gguf_for(args: argparse.Namespace, name: str) -> Path:
    """``name``'s checkpoint as an f32 GGUF, converted once by llama.cpp's own ``convert_hf_to_gguf.py``
    (from ``--llamacpp-src``): Gemma 3 with no ``tokenizer.model`` takes the tokenizer.json path, a GPT-2
    BPE vocabulary with SmolLM's pre-tokenizer, so llama.cpp and kvreuse share the token ids."""
    from kvreuse.runtime.loading.model_source import cache_dir

    out = Path(args.llamacpp_gguf or cache_dir() / "bench" / f"window-{name}-f32.gguf")  # not in the HF dir
    if not out.is_file():
        src = Path(args.llamacpp_src)
        env = dict(os.environ, PYTHONPATH=str(src / "gguf-py"))
        cmd = [sys.executable, str(src / "convert_hf_to_gguf.py"), str(model_path(name)), "--outtype", "f32"]
        subprocess.run([*cmd, "--outfile", str(out)], env=env, check=True, capture_output=True)
    return out


def side(args: argparse.Namespace, script: str, where: str, job: dict) -> dict:
    """One llama.cpp side script (``benchmarks/peers/<script>``) run on ``job``; its KV cache sizes from the log."""
    env = dict(os.environ, LD_PRELOAD=args.llamacpp_preload) if args.llamacpp_preload else None
    r = subprocess.run([args.llamacpp_python, str(Path(__file__).resolve().parents[1] / "peers" / script), where], input=json.dumps(job),
                       capture_output=True, text=True, env=env, check=True)  # fmt: skip
    res = json.loads(r.stdout)
    # per context: the old build's "KV self size = X MiB", 0.5.0's "size = X MiB ( N cells, L layers"
    kv = re.findall(
        r"KV self size\s*=\s*([\d.]+) MiB|kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers",
        r.stderr,
    )
    res["kv_caches"] = [
        {"mib": float(a or b), "cells": int(c or 0), "layers": int(d or 0)} for a, b, c, d in kv
    ]
    return res


def llamacpp(args: argparse.Namespace, name: str, sessions: dict[str, list[dict]]) -> dict:
    """Replay the logged requests in llama.cpp: the cffi build (``llamacpp_session_side.py``) and/or
    0.5.0's libllama (``llamacpp_swa_side.py``) with the server's default 4 slots and with ``-np 1``."""
    job = {"gguf": str(gguf_for(args, name)), "threads": torch.get_num_threads(), "sessions": sessions}
    out = {}
    if args.llamacpp_module:
        out["cffi"] = side(args, "llamacpp_session_side.py", args.llamacpp_module, job)
    for slots in (4, 1) if args.llamacpp_lib else ():
        out[f"v0.5.0/slots{slots}"] = side(
            args, "llamacpp_swa_side.py", args.llamacpp_lib, {**job, "slots": slots}
        )
    return out


def run(args: argparse.Namespace) -> dict:
    turns = 4 if args.quick else 10
    context = 2048 if args.quick else 8192
    out: dict = {"dtype": "float32", "threads": torch.get_num_threads(), "window": WINDOW, "page_size": 16}
    progress(f"memory at {context} tokens")
    mem = [memory_at(n, context) for n in ("gemma3", "twin", "gemma4", "gemma4-twin", "ministral", "mistral")]
    out["memory"] = mem
    per_token = {m["model"]: m["bytes_per_token"] for m in mem}
    out["gemma3_vs_twin_bytes"] = per_token["gemma3"] / per_token["twin"]
    out["gemma4_vs_twin_bytes"] = per_token["gemma4"] / per_token["gemma4-twin"]
    print(format_table(["model", "pool pages", "page B", "ring B", "snapshots B", "B/token"],
                       [[m["model"], m["pool_pages"], m["page_bytes"], m["ring_bytes"], m["snapshot_bytes"],
                         f"{m['bytes_per_token']:.0f}"] for m in mem]))  # fmt: skip
    print(f"gemma3 / full-attention twin, KV bytes per context token: {out['gemma3_vs_twin_bytes']:.3f}")
    print(f"gemma4 / full-attention twin, KV bytes per context token: {out['gemma4_vs_twin_bytes']:.3f}")
    out["sessions"] = {}
    logs: dict[str, list[dict]] = {"session": [], "same_turn": []}
    for name in ("gemma3", "gemma4", "ministral", "mistral"):
        for label, kw in (("cache", {}),):  # cache off prefills every prompt whole: the prompt column
            progress(f"session {name} {label}")
            rows = session(name, turns, seed=3, log=logs["session"] if name == "gemma3" else None, **kw)
            out["sessions"][f"{name}/{label}"] = rows
            print(f"{name}, prefix cache {label}")
            print(format_table(["turn", "prompt", "cached", "prefilled", "ideal", "cut"],
                               [[r["turn"], r["prompt"], r["cached"], r["prefilled"], r["ideal"], r["snapshot_cut"]]
                                for r in rows]))  # fmt: skip
    models = ("gemma3", "gemma4", "ministral", "mistral")
    out["same_turn"] = [same_turn(n, logs["same_turn"] if n == "gemma3" else None) for n in models]
    print(format_table(["model", "first", "prompt", "cached", "prefilled", "ideal"],
                       [[r["model"], r["first"], r["prompt"], r["cached"], r["prefilled"], r["ideal"]]
                        for r in out["same_turn"]]))  # fmt: skip
    if args.llamacpp_python and (args.llamacpp_module or args.llamacpp_lib):
        progress("llama.cpp replay of the gemma3 session and same turn")
        out["llamacpp"] = lcp = llamacpp(args, "gemma3", logs)
        ours, keys = out["sessions"]["gemma3/cache"], list(lcp)
        print("gemma3 session: kvreuse prefilled, llama.cpp evaluated (server defaults; * = full re-process)")
        cols = [
            [f"{x['evaluated']}{'*' if x['fallback'] else ''}" for x in lcp[k]["sessions"]["session"]]
            for k in keys
        ]
        print(format_table(["turn", "prompt", "kvreuse", *keys, "ideal"],
                           [[r["turn"], r["prompt"], r["prefilled"], *(c[i] for c in cols), r["ideal"]]
                            for i, r in enumerate(ours)]))  # fmt: skip
        for k in keys:
            x = lcp[k]["sessions"]["same_turn"][1]
            print(f"same turn, {k}: evaluated {x['evaluated']} of {x['prompt']} (fallback {x['fallback']})")
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("window_paging", __doc__.split("\n")[0])
    p.add_argument("--llamacpp-python", default=None, help="interpreter with numpy + cffi for llama.cpp")
    p.add_argument("--llamacpp-module", default=None, help="folder holding the _llama_cpp_cpu CFFI module")
    p.add_argument("--llamacpp-preload", default=None, help="LD_PRELOAD for that module (a libstdc++ shim)")
    p.add_argument("--llamacpp-lib", default=None, help="folder with llama.cpp 0.5.0's libllama/libggml")
    p.add_argument("--llamacpp-src", default=None, help="llama.cpp tree with convert_hf_to_gguf.py, gguf-py")
    p.add_argument(
        "--llamacpp-gguf", default=None, help="the converted GGUF (made from --llamacpp-src if absent)"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return bench_main("window_paging", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
