"""llama.cpp's side of ``kvreuse.benchmarks.kernels.quantized``: greedy tokens, prefill and decode time on a GGUF.

Runs in a separate interpreter over a prebuilt llama.cpp (never a kvreuse dependency):
``python benchmarks/peers/llamacpp_side.py MODULE_DIR`` reads one JSON job on stdin and writes one JSON result
on stdout.  ``MODULE_DIR`` holds a CFFI module ``_llama_cpp_cpu`` exposing llama.h as ``lib``/``ffi`` (the
CPU build inside the ``llama-cpp-cffi`` wheel; see ``benchmarks/README.md`` for the setup).
Job: ``{"gguf", "threads", "prompts": [[ids]], "new"}``.  Per prompt: the KV cache cleared, the prompt
evaluated in one batch (timed: prefill), then ``new`` greedy tokens one at a time (timed: decode, the
``new - 1`` steps after the first token).
"""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    from _llama_cpp_cpu import ffi, lib  # type: ignore[import-not-found]

    job = json.load(sys.stdin)
    lib.llama_backend_init()
    mparams = lib.llama_model_default_params()
    model = lib.llama_model_load_from_file(job["gguf"].encode(), mparams)
    if model == ffi.NULL:
        raise SystemExit(f"llama.cpp could not load {job['gguf']}")
    longest = max(len(p) for p in job["prompts"]) + job["new"] + 8
    cparams = lib.llama_context_default_params()
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = max(512, longest)
    cparams.n_threads = cparams.n_threads_batch = job["threads"]
    ctx = lib.llama_init_from_model(model, cparams)
    n_vocab = lib.llama_n_vocab(lib.llama_model_get_vocab(model))

    def feed(ids: list[int]) -> int:
        arr = ffi.new("int32_t[]", ids)
        if lib.llama_decode(ctx, lib.llama_batch_get_one(arr, len(ids))) != 0:
            raise SystemExit("llama_decode failed")
        logits = lib.llama_get_logits_ith(ctx, -1)
        return int(np.frombuffer(ffi.buffer(logits, 4 * n_vocab), dtype=np.float32).argmax())

    results = []
    for prompt in job["prompts"]:
        lib.llama_kv_self_clear(ctx)
        t0 = time.perf_counter()
        tok = feed(prompt)
        prefill = time.perf_counter() - t0
        tokens = [tok]
        t1 = time.perf_counter()
        while len(tokens) < job["new"]:
            tokens.append(feed([tokens[-1]]))
        decode = time.perf_counter() - t1
        results.append(
            {"tokens": tokens, "prefill_s": prefill, "decode_s": decode, "prompt_tokens": len(prompt)}
        )
    json.dump({"results": results, "threads": job["threads"],
               "system_info": ffi.string(lib.llama_print_system_info()).decode()}, sys.stdout)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
