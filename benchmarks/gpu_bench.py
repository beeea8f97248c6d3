"""kvreuse against transformers (sdpa) on a GPU: real-size Qwen3 architectures with random weights.

Run from the repository root: ``python -m benchmarks.gpu_bench [--out PATH] [--quick]``.

One run, in this order, rewriting the JSON after every section so a timeout still leaves results:

1. kernels: ``benchmarks.kernel_bench`` (Triton decode/extend vs the torch reference and the
   memory-bandwidth floor measured in the same run);
2. per model (Qwen3-0.6B, then Qwen3-8B unless ``--quick`` or memory/time is short): a random bf16
   checkpoint is built on the GPU with transformers, saved as safetensors with a word-level tokenizer,
   loaded by ``Engine(model_dir=...)``; kvreuse, then the same in-memory transformers model, measure
   prefill tokens/s, decode tokens/s and TTFT with and without a cached prefix.

``--cpu-smoke`` runs the same code on CPU with a 2-layer config and small sizes (fp32), to test the path.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.gpu_checkpoint import ARCHS, build_checkpoint
from runtime.engine import Engine
from runtime.sampling import SamplingParams

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "gpu.json"
CACHED_SUFFIX = 256  # new tokens after a cached prefix: a new turn of an agent's conversation (at most 1/4)
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


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prompt(n: int, salt: int, vocab: int) -> list[int]:
    """Deterministic random token ids, so both implementations see the same prompts."""
    g = torch.Generator().manual_seed(n * 1000 + salt)
    return torch.randint(10, vocab, (n,), generator=g).tolist()


def suffix_len(context: int) -> int:
    return min(CACHED_SUFFIX, context // 4)


def timed(device: torch.device, fn) -> tuple[float, object]:
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t, out


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


def decode_row(batch: int, ctx: int, step_s: list[float], tokens_batch0: list[int]) -> dict:
    """Rate from the median step (robust to a one-off kernel compile) and from the total."""
    med = statistics.median(step_s)
    return {"batch": batch, "context": ctx, "steps": len(step_s), "median_step_ms": med * 1e3,
            "tokens_per_s": batch / med, "tokens_per_s_mean": batch * len(step_s) / sum(step_s),
            "tokens_batch0": tokens_batch0}  # fmt: skip


# -- transformers --------------------------------------------------------------------------------------
@torch.inference_mode()
def bench_hf(model, sizes: dict, reps: int, vocab: int) -> dict:
    dev = next(model.parameters()).device
    # transformers 5.x renamed the argument; older releases only know past_key_values
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def prefill(ids: list[list[int]] | torch.Tensor, cache=None):
        x = ids if isinstance(ids, torch.Tensor) else torch.tensor(ids, device=dev)
        return model(x, use_cache=True, logits_to_keep=1, **{cache_arg: cache})

    prefill([prompt(sizes["prefill"][0], 999, vocab)])
    res: dict = {"prefill": [], "ttft": [], "decode": []}
    for n in sizes["prefill"]:
        times = [timed(dev, lambda n=n, r=r: prefill([prompt(n, r, vocab)]))[0] for r in range(reps)]
        res["prefill"].append({"tokens": n, "s": min(times), "tokens_per_s": n / min(times)})
    for n in sizes["ttft"]:
        # transformers keeps no cache across calls; "manual" reuses a prefix cache the caller kept
        base = prompt(n, 0, vocab)
        uncached = next((r["s"] for r in res["prefill"] if r["tokens"] == n), None)
        if uncached is None:
            uncached = timed(dev, lambda b=base: prefill([b]))[0]
        s = suffix_len(n)
        cache = prefill([base[: n - s]]).past_key_values
        manual = []
        for r in range(reps):
            suffix = prompt(s, 100 + r, vocab)
            manual.append(timed(dev, lambda x=suffix, c=cache: prefill([x], c))[0])
            cache.crop(-s)  # negative: drop the suffix (the only form every transformers release accepts)
        del cache
        res["ttft"].append({"context": n, "uncached_s": uncached, "manual_prefix_reuse_s": min(manual)})
    for b in sizes["batches"]:
        res["decode"].append(hf_decode(prefill, b, sizes, vocab))
    return res


def hf_decode(prefill, batch: int, sizes: dict, vocab: int) -> dict:
    """Greedy steps with transformers' default DynamicCache, after one batched prefill."""
    ctx, steps = sizes["decode_ctx"], sizes["steps"]
    out = prefill([prompt(ctx, 500 + i, vocab) for i in range(batch)])
    cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1)
    generated, step_s = [tok], []
    for _ in range(steps - 1):
        dt, out = timed(tok.device, lambda t=tok, c=cache: prefill(t[:, None], c))
        tok = out.logits[:, -1].argmax(-1)
        generated.append(tok)
        step_s.append(dt)
    del cache, out
    return decode_row(batch, ctx, step_s, torch.stack(generated, 1)[0].tolist())


# -- one model, both implementations ----------------------------------------------------------------------
def first_logits_check(eng: Engine, model, n: int, vocab: int) -> dict:
    """Last-position logits of one prompt from both implementations (same weights): how close they are."""
    ids = prompt(n, 0, vocab)
    eng.record_logits = True
    req = eng.make_request(ids, SamplingParams(max_tokens=1, ignore_eos=True))
    eng.record_logits = False
    eng.submit(req)
    while eng.has_work():
        eng.step()
    ours = req.logits_trace[0].float()
    with torch.inference_mode():
        dev = next(model.parameters()).device
        ref = model(torch.tensor([ids], device=dev), logits_to_keep=1).logits[0, -1].float().cpu()
    return {"tokens": n, "max_abs_diff": float((ours - ref).abs().max()), "ref_max_abs": float(ref.abs().max()),
            "argmax_equal": int(ours.argmax()) == int(ref.argmax())}  # fmt: skip


def bench_model(name: str, args: argparse.Namespace, device: torch.device, dtype: str, sizes: dict) -> dict:
    reps = 1 if args.quick or args.cpu_smoke else 2
    with tempfile.TemporaryDirectory(prefix=f"kvreuse-{name}-") as tmp:
        t, (model, cfg) = timed(device, lambda: build_checkpoint(ARCHS[name], Path(tmp), device, dtype))
        vocab = cfg["vocab_size"]
        entry: dict = {"config": cfg, "params": sum(p.numel() for p in model.parameters()), "build_s": t}
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        kv = KV_CAP[name]
        if device.type == "cuda":
            kv = min(kv, int(0.5 * (torch.cuda.mem_get_info(device)[0] - weight_bytes)))
        t, eng = timed(device, lambda: Engine(
            model_dir=tmp, dtype=dtype, device=str(device), attention_backend=args.attention_backend,
            kv_cache_memory=kv, chunk_size=args.chunk_size, max_running=max(sizes["batches"]),
        ))  # fmt: skip
        entry["engine"] = {"load_s": t, "backend": eng.runner.backend.name, "kv_pool_tokens": eng.runner.pool.num_tokens,
                           "chunk_size": args.chunk_size}  # fmt: skip
        entry["kvreuse"] = bench_engine(eng, sizes, reps, vocab)
        entry["check"] = first_logits_check(eng, model, sizes["prefill"][0], vocab)
        del eng
        release(device)
        entry["transformers"] = bench_hf(model, sizes, reps, vocab)
        ours, theirs = entry["kvreuse"]["decode"][0], entry["transformers"]["decode"][0]
        entry["check"]["greedy_tokens_equal_batch0"] = ours["tokens_batch0"] == theirs["tokens_batch0"]
        del model
        release(device)
    return entry


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
                    "torch": torch.__version__, "args": {k: str(v) for k, v in vars(args).items()}}  # fmt: skip
    if device.type == "cuda":
        from benchmarks import kernel_bench

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
            result["models"][name] = bench_model(name, args, device, dtype, sizes)
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
