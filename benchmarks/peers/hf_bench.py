"""The transformers side of ``kvreuse.benchmarks.kernels.gpu_bench``: the same measurements on an HF model (sdpa).

transformers keeps no KV cache across calls, so its TTFT is a full prefill; ``manual_prefix_reuse_s``
is what a caller gets by keeping a prefix's ``DynamicCache`` itself and feeding only the new suffix.
"""

from __future__ import annotations

import inspect

import torch

from kvreuse.benchmarks.kernels.gpu_timing import decode_row, prompt, suffix_len, timed


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
