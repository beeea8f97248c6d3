"""llama.cpp's side of ``kvreuse.benchmarks.serving.cached_turns_peers``: one context kept across a conversation's
turns the way llama-server keeps its slot, each turn's time to the first token.

Runs in a separate interpreter over the prebuilt ``llama-cpp-cffi`` CPU build (never a kvreuse
dependency; setup in ``benchmarks/README.md``): ``python benchmarks/peers/llamacpp_turns_side.py MODULE_DIR``.
Line protocol on stdin/stdout, one JSON object a line:

* first line ``{"convert": {"src", "dst", "ftype"}}``: ``llama_model_quantize`` of ``src`` to ``dst``
  (``ftype`` 0 = all F32, 32 = BF16; ``allow_requantize``: a Q4_1 file is dequantised by ggml itself),
  answers ``{"rc"}`` and exits;
* or first line ``{"gguf", "threads", "n_ctx"}`` (answers ``{"system_info"}``), then per turn
  ``{"prompt": [ids]}`` answered ``{"ttft_s", "n_past", "evaluated", "token"}``.

Per turn, as llama-server with its defaults (``cache_prompt`` true, ``n_batch`` 2048, one slot; the
server logic cited in ``llamacpp_session_side.py``): ``n_past`` = the common prefix of the context's tokens
and the prompt, lowered by one when it is the whole prompt; positions ``>= n_past`` removed; the rest
decoded in ``n_batch`` chunks with logits on the last token only.  Timed: from the prompt's arrival to
the first token's argmax (the prefix match, the removal, the decode, the logits read).
"""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    from _llama_cpp_cpu import ffi, lib  # type: ignore[import-not-found]
    from llamacpp_calls import common_prefix, decode, load_model  # type: ignore[import-not-found]

    job = json.loads(sys.stdin.readline())
    lib.llama_backend_init()
    if "convert" in job:
        c = job["convert"]
        params = lib.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize = c["ftype"], True
        rc = lib.llama_model_quantize(c["src"].encode(), c["dst"].encode(), ffi.addressof(params))
        print(json.dumps({"rc": int(rc)}), flush=True)
        return 0
    model = load_model(ffi, lib, job["gguf"])
    n_batch = 2048
    cparams = lib.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch = job["n_ctx"], n_batch
    cparams.n_threads = cparams.n_threads_batch = job["threads"]
    ctx = lib.llama_init_from_model(model, cparams)
    n_vocab = lib.llama_n_vocab(lib.llama_model_get_vocab(model))
    print(json.dumps({"system_info": ffi.string(lib.llama_print_system_info()).decode()}), flush=True)

    def first_token(ids: list[int], pos: int) -> int:
        decode(lib, ctx, ids, pos, n_batch)
        logits = lib.llama_get_logits_ith(ctx, -1)
        return int(np.frombuffer(ffi.buffer(logits, 4 * n_vocab), dtype=np.float32).argmax())

    held: list[int] = []  # what the context's KV holds
    for line in sys.stdin:
        prompt = json.loads(line)["prompt"]
        t0 = time.perf_counter()
        n_past = common_prefix(held, prompt)
        if n_past == len(prompt):
            n_past -= 1  # a token must be evaluated for logits
        if not lib.llama_kv_self_seq_rm(ctx, 0, n_past, -1):
            lib.llama_kv_self_seq_rm(ctx, -1, -1, -1)
            n_past = 0
        token = first_token(prompt[n_past:], n_past)
        ttft = time.perf_counter() - t0
        held = list(prompt)
        print(json.dumps({"ttft_s": ttft, "n_past": n_past, "evaluated": len(prompt) - n_past,
                          "token": token}), flush=True)  # fmt: skip
    lib.llama_free(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
