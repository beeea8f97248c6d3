"""kvreuse against transformers (sdpa) on a GPU: real-size Qwen3 architectures with random weights.

Run from the repository root: ``python -m kvreuse.benchmarks.kernels.gpu_bench [--out PATH] [--quick]``.

One run, in this order, rewriting the JSON after every section so a timeout still leaves results:

1. kernels: ``kvreuse.benchmarks.kernels.kernel_bench`` (Triton decode/extend vs the torch reference and the
   memory-bandwidth floor measured in the same run);
2. per model (Qwen3-0.6B, then Qwen3-8B unless ``--quick`` or memory/time is short): a random bf16
   checkpoint is built on the GPU with transformers, saved as safetensors with a word-level tokenizer,
   loaded by ``Engine(model_dir=...)``; kvreuse, then the same in-memory transformers model, measure
   prefill tokens/s, decode tokens/s and TTFT with and without a cached prefix; the engine's decode
   forward is also timed eagerly and replayed from CUDA graphs (``kvreuse.benchmarks.kernels.graph_bench``).

``--cpu-smoke`` runs the same code on CPU with a 2-layer config and small sizes (fp32), to test the path.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

from kvreuse.benchmarks.kernels.gpu_checkpoint import ARCHS, build_checkpoint
from kvreuse.benchmarks.kernels.gpu_timing import decode_row, prompt, suffix_len, timed
from kvreuse.benchmarks.peers.hf_bench import bench_hf
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.sampling.params import SamplingParams

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "gpu.json"
KV_CAP = {"qwen3-0.6b": 16 << 30, "qwen3-8b": 24 << 30, "smoke": 64 << 20}
FULL = dict(prefill=[1024, 8192, 32768], ttft=[8192, 32768], batches=[1, 8, 64], decode_ctx=1024, steps=64)
SMOKE = dict(prefill=[16, 64], ttft=[64, 128], batches=[1, 4], decode_ctx=16, steps=6)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results path")
    p.add_argument("--quick", action="store_true", help="Qwen3-0.6B only, one repetition, 32 decode steps")
    p.add_argument(
        "--cpu-smoke", action="store_true", help="tiny 2-layer model on CPU: tests the code path only"
    )
    p.add_argument("--chunk-size", type=int, default=8192, help="engine prefill chunk (tokens per step)")
    p.add_argument("--attention-backend", choices=["auto", "reference", "triton"], default="auto")
    p.add_argument(
        "--time-budget", type=float, default=420.0, help="seconds; later sections are skipped past it"
    )
    return p.parse_args(argv)


# -- kvreuse -----------------------------------------------------------------------------------------
def bench_engine(eng: Engine, sizes: dict, reps: int, vocab: int) -> dict:
    dev = eng.device
    first = SamplingParams(max_tokens=1, ignore_eos=True)
    warm = SamplingParams(max_tokens=2, ignore_eos=True)
    eng.generate(prompt(sizes["prefill"][0], 999, vocab), warm)  # compile prefill and decode kernels
    res: dict = {"prefill": [], "ttft": [], "decode": []}
    for n in sizes["prefill"]:
        times = [
            timed(dev, lambda n=n, r=r: eng.generate(prompt(n, r, vocab), first))[0] for r in range(reps)
        ]
        res["prefill"].append({"tokens": n, "s": min(times), "tokens_per_s": n / min(times)})
    for n in sizes["ttft"]:
        base = prompt(n, 0, vocab)  # computed (and cached) by the prefill section when n is one of its sizes
        uncached = next((r["s"] for r in res["prefill"] if r["tokens"] == n), None)
        if uncached is None:
            uncached = timed(dev, lambda b=base: eng.generate(b, first))[0]
        cached, hits, s = [], [], suffix_len(n)
        for r in range(reps):
            ids = base[: n - s] + prompt(s, 100 + r, vocab)
            t, outs = timed(dev, lambda ids=ids: eng.generate(ids, first))
            cached.append(t)
            hits.append(outs[0].cached_tokens)
        res["ttft"].append(
            {"context": n, "uncached_s": uncached, "cached_s": min(cached), "cached_tokens": min(hits)}
        )
    for b in sizes["batches"]:
        res["decode"].append(engine_decode(eng, b, sizes, vocab))
    return res


def engine_decode(eng: Engine, batch: int, sizes: dict, vocab: int) -> dict:
    """Tokens/s over the steps in which all ``batch`` requests decode (staggered prefill ends excluded)."""
    ctx, steps = sizes["decode_ctx"], sizes["steps"]
    params = SamplingParams(max_tokens=steps, ignore_eos=True)
    reqs = [eng.make_request(prompt(ctx, 500 + i, vocab), params) for i in range(batch)]
    for r in reqs:
        eng.submit(r)
    step_s = []
    while eng.has_work():
        full = all(r.output_ids and r.finish_reason is None for r in reqs)
        dt, _ = timed(eng.device, eng.step)
        if full:
            step_s.append(dt)
    return decode_row(batch, ctx, step_s, reqs[0].output_ids)


# -- one model, both implementations ----------------------------------------------------------------------
def first_logits_check(eng: Engine, model, n: int, vocab: int) -> dict:
    """Last-position logits of one prompt from both implementations (same weights): how close they are."""
    ids = prompt(n, 0, vocab)
    req = eng.make_request(ids, SamplingParams(max_tokens=1, ignore_eos=True))
    forward, results = eng.runner.model.forward, []  # the one request's last forward has its only logits row
    eng.runner.model.forward = lambda *a, **k: results.append(forward(*a, **k)) or results[-1]
    try:
        eng.submit(req)
        while eng.has_work():
            eng.step()
    finally:
        del eng.runner.model.forward  # the instance attribute goes; the class's forward is back
    ours = results[-1][0].float().cpu()
    with torch.inference_mode():
        dev = next(model.parameters()).device
        ref = model(torch.tensor([ids], device=dev), logits_to_keep=1).logits[0, -1].float().cpu()
    return {"tokens": n, "max_abs_diff": float((ours - ref).abs().max()), "ref_max_abs": float(ref.abs().max()),
            "argmax_equal": int(ours.argmax()) == int(ref.argmax())}  # fmt: skip


def bench_model(
    name: str,
    args: argparse.Namespace,
    device: torch.device,
    dtype: str,
    sizes: dict,
    entry: dict,
    checkpoint,
) -> None:
    """Fill ``entry`` section by section, calling ``checkpoint()`` (which saves the JSON) after each."""
    reps = 1 if args.quick or args.cpu_smoke else 2
    with tempfile.TemporaryDirectory(prefix=f"kvreuse-{name}-") as tmp:
        t, (model, cfg) = timed(device, lambda: build_checkpoint(ARCHS[name], Path(tmp), device, dtype))
        vocab = cfg["vocab_size"]
        entry.update(config=cfg, params=sum(p.numel() for p in model.parameters()), build_s=t)
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        kv = KV_CAP[name]
        if device.type == "cuda":
            kv = min(kv, int(0.5 * (torch.cuda.mem_get_info(device)[0] - weight_bytes)))
        t, eng = timed(device, lambda: Engine(
            model_dir=tmp, dtype=dtype, device=str(device), attention_backend=args.attention_backend,
            kv_cache_memory=kv, chunk_size=args.chunk_size, max_running=max(sizes["batches"]),
        ))  # fmt: skip
        entry["engine"] = {"load_s": t, "backend": eng.runner.backend.name, "kv_pool_tokens": eng.admission.kv_capacity_tokens,
                           "chunk_size": args.chunk_size}  # fmt: skip
        entry["kvreuse"] = bench_engine(eng, sizes, reps, vocab)
        entry["check"] = first_logits_check(eng, model, sizes["prefill"][0], vocab)
        checkpoint()
        backend, max_len = eng.runner.backend.name, eng.max_model_len
        del eng
        release(device)
        entry["cuda_graphs"] = graph_section(Path(tmp), dtype, device, backend, max_len, sizes)
        checkpoint()
        release(device)
        entry["transformers"] = bench_hf(model, sizes, reps, vocab)
        ours, theirs = entry["kvreuse"]["decode"][0], entry["transformers"]["decode"][0]
        entry["check"]["greedy_tokens_equal_batch0"] = ours["tokens_batch0"] == theirs["tokens_batch0"]
        del model
        release(device)


def graph_section(
    model_dir: Path, dtype: str, device: torch.device, backend: str, max_model_len: int, sizes: dict
) -> dict:
    """Eager vs CUDA-graph decode forward on a model runner of its own (the engine is gone by then);
    a failure is recorded, not fatal: later sections still run."""
    if device.type != "cuda" or backend != "triton":
        return {"skipped": "needs CUDA and the triton attention backend"}
    from kvreuse.benchmarks.kernels.graph_bench import bench_decode_graphs

    try:
        return bench_decode_graphs(
            model_dir, dtype, device, max_model_len, sizes["batches"], sizes["decode_ctx"]
        )
    except Exception as e:  # noqa: BLE001 (one broken section must not lose the rest of a GPU lease)
        return {"error": f"{type(e).__name__}: {e}".splitlines()[0]}


def release(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def save(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def run(args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    result: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "torch": torch.__version__, "transformers": transformers.__version__, "args": {k: str(v) for k, v in vars(args).items()}}  # fmt: skip
    if device.type == "cuda":
        from kvreuse.benchmarks.kernels import kernel_bench

        result["kernels"] = kernel_bench.run(kernel_bench.parse_args([]))
    else:
        result["kernels"] = {"skipped": "kernel timings need CUDA"}
    save(result, args.out)
    models = ["smoke"] if args.cpu_smoke else ["qwen3-0.6b"] + ([] if args.quick else ["qwen3-8b"])
    sizes = dict(SMOKE) if args.cpu_smoke else dict(FULL, steps=32) if args.quick else dict(FULL)
    dtype = "float32" if args.cpu_smoke else "bfloat16"
    result["models"] = {}
    for i, name in enumerate(models):
        if i and time.perf_counter() - start > args.time_budget / 2:
            result["models"][name] = {
                "skipped": f"over half the time budget ({args.time_budget:.0f}s) already spent"
            }
        elif name == "qwen3-8b" and torch.cuda.mem_get_info(device)[0] < 64 << 30:
            result["models"][name] = {"skipped": "needs 64 GiB of free GPU memory"}
        else:
            print(f"gpu_bench: {name}", flush=True)
            entry = result["models"][name] = {}
            bench_model(name, args, device, dtype, sizes, entry, lambda: save(result, args.out))
        result["elapsed_s"] = time.perf_counter() - start
        save(result, args.out)
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("gpu_bench: no CUDA device available; run it on a GPU (or --cpu-smoke to test the code path).")
        return 2
    result = run(args)
    print(f"gpu_bench: wrote {args.out} in {result['elapsed_s']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
