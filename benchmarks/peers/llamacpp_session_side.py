"""llama.cpp's side of ``kvreuse.benchmarks.kernels.window_paging``: prompt tokens llama.cpp evaluates per turn when it
keeps one context between requests the way llama-server does with its default settings.

Runs in a separate interpreter over the prebuilt ``llama-cpp-cffi`` CPU build (never a kvreuse
dependency; setup in ``benchmarks/README.md``): ``python benchmarks/peers/llamacpp_session_side.py MODULE_DIR``
reads one JSON job on stdin, writes one JSON result on stdout.
Job: ``{"gguf", "threads", "sessions": {name: [{"prompt": [ids], "reply": [ids]}]}}``; each session runs
on a fresh context.  A request's reply is replayed, not sampled: the server decodes every sampled token
but the last into the context, so the context ends as prompt + reply[:-1], the same token ids the
kvreuse side held (the two engines' random-weight logits differ, their conversations must not).

The decision per request follows llama-server (``tools/server/server-context.cpp`` of the llama.cpp
vendored in the llama-cpp-python 0.3.36 sdist; defaults from its ``common/common.h``: ``cache_prompt``
true (l.629), ``n_cache_reuse`` 0 (l.628), ``swa_full`` false (l.574), ``n_ctx`` 0 = the model's
trained context (l.452), ``n_batch`` 2048 (l.453), one slot (l.457)):

1. ``n_past`` = common prefix of the context's tokens and the prompt (l.3200);
2. if ``n_past > 0``: ``pos_min_thold = max(0, n_past - n_swa - (0 if new tokens else 1))`` (l.3278)
   and, when the context's oldest kept position ``pos_min >= pos_min_thold`` (l.3281, 3330), the SWA
   cache lacks the window the next token needs: a context checkpoint is searched (l.3332-3344), and
   without one the server "forc[es] full prompt re-processing due to lack of cache data" (l.3360-3365):
   ``n_past = 0``.  This build cannot make checkpoints (no ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``), so
   that branch would be a fallback here;
3. ``n_past == len(prompt)`` is lowered by one: a token must be evaluated for logits (l.3383-3388);
4. the context drops positions ``>= n_past`` (``seq_rm``, l.3423-3425); a failed removal clears it and
   re-evaluates everything (the older server's handling; the build's memory API is ``llama_kv_self_*``).

``pos_min`` is read from the build's KV-cell view (it has no ``llama_*_seq_pos_min``): this build
predates llama.cpp's SWA cache (it has no ``swa_full`` context parameter), so Gemma 3's sliding layers
keep every position and ``pos_min`` stays 0.  Per request: prompt, evaluated, n_past, pos_min, fallback.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    sys.path.insert(0, sys.argv[1])
    from _llama_cpp_cpu import ffi, lib  # type: ignore[import-not-found]
    from llamacpp_calls import common_prefix, decode, load_model  # type: ignore[import-not-found]

    job = json.load(sys.stdin)
    lib.llama_backend_init()
    model = load_model(ffi, lib, job["gguf"])
    buf = ffi.new("char[]", 64)
    arch = "gemma3"
    n_swa = 0
    if lib.llama_model_meta_val_str(model, f"{arch}.attention.sliding_window".encode(), buf, 64) > 0:
        n_swa = int(ffi.string(buf))
    n_ctx = lib.llama_model_n_ctx_train(model)  # the server's n_ctx = 0
    n_batch = 2048

    def pos_min(ctx) -> int:
        view = lib.llama_kv_cache_view_init(ctx, 1)
        lib.llama_kv_cache_view_update(ctx, ffi.addressof(view))
        ps = [view.cells[i].pos for i in range(view.n_cells) if view.cells_sequences[i] == 0]
        lib.llama_kv_cache_view_free(ffi.addressof(view))
        return min(ps) if ps else -1

    out: dict = {"n_swa": n_swa, "n_ctx": n_ctx, "sessions": {}}
    for name, requests in job["sessions"].items():
        cparams = lib.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch = n_ctx, n_batch
        cparams.n_threads = cparams.n_threads_batch = job["threads"]
        ctx = lib.llama_init_from_model(model, cparams)
        held: list[int] = []  # slot.prompt.tokens: what the context's KV holds
        rows = []
        for req in requests:
            prompt, reply = req["prompt"], req["reply"]
            n_past = common_prefix(held, prompt)
            pmin, fallback = None, False
            if n_past > 0:
                thold = max(0, n_past - n_swa - (0 if n_past < len(prompt) else 1))
                pmin = pos_min(ctx)
                if pmin >= thold:
                    fallback, n_past = True, 0
            if n_past == len(prompt) and n_past > 0:
                n_past -= 1
            if not lib.llama_kv_self_seq_rm(ctx, 0, n_past, -1):
                lib.llama_kv_self_seq_rm(ctx, -1, -1, -1)
                fallback, n_past = True, 0
            decode(lib, ctx, prompt[n_past:], n_past, n_batch)
            rows.append({"prompt": len(prompt), "evaluated": len(prompt) - n_past, "n_past": n_past,
                         "pos_min": pmin, "fallback": fallback})  # fmt: skip
            for i, t in enumerate(reply[:-1]):  # the sampled tokens the server feeds back
                decode(lib, ctx, [t], len(prompt) + i, n_batch)
            held = prompt + reply[:-1]
            rows[-1]["kv_used_cells"] = lib.llama_kv_self_used_cells(ctx)
        lib.llama_free(ctx)
        out["sessions"][name] = rows
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
