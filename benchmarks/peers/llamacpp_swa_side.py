"""A current llama.cpp's side of ``kvreuse.benchmarks.kernels.window_paging``: its SWA cache (``swa_full`` off) and
llama-server's prompt-cache decisions with context checkpoints, per request of a replayed session.

Runs in a separate interpreter with cffi (ABI mode, no compiler) over a prebuilt ``libllama`` of
llama.cpp 0.5.0, the version vendored in the llama-cpp-python 0.3.36 sdist whose server this follows
(setup in ``benchmarks/README.md``): ``python benchmarks/peers/llamacpp_swa_side.py LIB_DIR`` reads one JSON
job on stdin, writes one JSON result on stdout.  Job: ``{"gguf", "threads", "slots", "sessions": {name:
[{"prompt": [ids], "reply": [ids]}]}}``; each session on a fresh context, the request in slot 0.  Replies
are replayed (the server decodes every sampled token but the last), so the context holds the ids the
kvreuse side held.

Server defaults (``common/common.h``, ``common/arg.cpp``, ``tools/server/server.cpp`` of that sdist):
``n_parallel`` -1 = auto -> 4 slots and ``kv_unified`` on (arg.cpp l.1403, server.cpp l.156-160),
``n_ctx`` 0 = the model's (common.h l.452), ``n_batch`` 2048, ``n_ubatch`` 512 (l.453-454), ``swa_full``
off (l.574), ``cache_prompt`` on, ``n_cache_reuse`` 0 (l.628-629), ``n_ctx_checkpoints`` 32,
``checkpoint_min_step`` 8192 (l.631-633).  ``tools/server/server-context.cpp``, per request:

* ``n_past`` = common prefix with the slot's tokens (l.3200); ``pos_min_thold = max(0, n_past - n_swa -
  (0 if new tokens else 1))`` (l.3278); if the memory's ``pos_min >= pos_min_thold`` (l.3281, l.3330) the
  newest checkpoint with ``pos_max <= n_past`` and ``pos_min < thold or pos_min == 0`` is restored
  (l.3332-3358: ``n_past = min(n_past, max(pos_min + 1, pos_max), its n_tokens)``), and without one
  "forcing full prompt re-processing due to lack of cache data" (l.3360-3365): ``n_past = 0``;
  checkpoints with ``pos_max > n_past`` are erased (l.3370-3378); ``n_past == len`` drops one (l.3383-3388);
  ``seq_rm(n_past, -1)`` (l.3425);
* the prompt goes in batches of ``n_batch`` that also stop ``4 + n_ubatch`` and 4 tokens before its end
  (l.3545-3558); before each batch is decoded a checkpoint (the SWA part of the sequence's state,
  ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``) is taken when the prompt is done or within ``n_ubatch`` of its
  end, the memory is not empty, and there is none yet or this is past the last by ``checkpoint_min_step``
  or near the end (l.3572-3616); ``create_checkpoint`` keeps at most 32 (l.2290-2355).  Message spans
  (user-message checkpoints) exist for chat requests only; these are token-id prompts (``/completion``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CDEF = """
struct llama_model; struct llama_context; struct llama_memory_i;
struct llama_model_params { void * devices; void * tensor_buft_overrides; int32_t n_gpu_layers;
  int split_mode; int load_mode; int lazy_mode; int32_t main_gpu; float * tensor_split;
  void * progress_callback; void * progress_callback_user_data; void * kv_overrides;
  bool vocab_only; bool check_tensors; bool use_extra_bufts; bool no_host; bool no_alloc; bool load_mtp; };
struct llama_context_params { uint32_t n_ctx; uint32_t n_batch; uint32_t n_ubatch; uint32_t n_seq_max;
  uint32_t n_rs_seq; uint32_t n_outputs_max; uint32_t n_outputs_max_per_seq; int32_t n_threads;
  int32_t n_threads_batch; int ctx_type; int rope_scaling_type; int pooling_type; int attention_type;
  int flash_attn_type; float rope_freq_base; float rope_freq_scale; float yarn_ext_factor;
  float yarn_attn_factor; float yarn_beta_fast; float yarn_beta_slow; uint32_t yarn_orig_ctx;
  float defrag_thold; void * cb_eval; void * cb_eval_user_data; int type_k; int type_v;
  void * abort_callback; void * abort_callback_data; bool embeddings; bool offload_kqv; bool no_perf;
  bool op_offload; bool swa_full; bool kv_unified; void * samplers; size_t n_samplers; void * ctx_other; };
typedef struct llama_batch { int32_t n_tokens; int32_t * token; float * embd; int32_t * pos;
  int32_t * n_seq_id; int32_t ** seq_id; int8_t * logits; } llama_batch;
void ggml_backend_load_all_from_path(const char * dir_path);
void llama_backend_init(void);
struct llama_model_params llama_model_default_params(void);
struct llama_context_params llama_context_default_params(void);
struct llama_model * llama_model_load_from_file(const char * path, struct llama_model_params params);
struct llama_context * llama_init_from_model(struct llama_model * model, struct llama_context_params params);
void llama_free(struct llama_context * ctx);
int32_t llama_model_n_swa(const struct llama_model * model);
int32_t llama_model_n_ctx_train(const struct llama_model * model);
struct llama_memory_i * llama_get_memory(const struct llama_context * ctx);
bool llama_memory_seq_rm(struct llama_memory_i * mem, int32_t seq_id, int32_t p0, int32_t p1);
int32_t llama_memory_seq_pos_min(struct llama_memory_i * mem, int32_t seq_id);
int32_t llama_memory_seq_pos_max(struct llama_memory_i * mem, int32_t seq_id);
size_t llama_state_seq_get_size_ext(struct llama_context * ctx, int32_t seq_id, uint32_t flags);
size_t llama_state_seq_get_data_ext(struct llama_context * ctx, uint8_t * dst, size_t size, int32_t seq_id,
  uint32_t flags);
size_t llama_state_seq_set_data_ext(struct llama_context * ctx, const uint8_t * src, size_t size,
  int32_t dest_seq_id, uint32_t flags);
llama_batch llama_batch_init(int32_t n_tokens, int32_t embd, int32_t n_seq_max);
void llama_batch_free(llama_batch batch);
int32_t llama_decode(struct llama_context * ctx, llama_batch batch);
"""
PARTIAL_ONLY, N_CKPT, CKPT_STEP, N_BATCH, N_UBATCH = 1, 32, 8192, 2048, 512


def session(ffi, lib, model, job: dict, requests: list[dict], n_swa: int) -> list[dict]:
    """One context (slot 0) through ``requests``: per request what the server would evaluate."""
    cp = lib.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 0, N_BATCH, N_UBATCH, job["slots"]
    cp.swa_full, cp.kv_unified = False, job["slots"] > 1
    cp.n_threads = cp.n_threads_batch = job["threads"]
    ctx = lib.llama_init_from_model(model, cp)
    mem = lib.llama_get_memory(ctx)
    held: list[int] = []
    ckpts: list[dict] = []  # n_tokens, pos_min, pos_max, data

    def decode(ids: list[int], pos: int) -> None:
        batch = lib.llama_batch_init(len(ids), 0, 1)
        batch.n_tokens = len(ids)
        for i, t in enumerate(ids):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, i == len(ids) - 1
        rc = lib.llama_decode(ctx, batch)
        lib.llama_batch_free(batch)
        if rc != 0:
            raise SystemExit(f"llama_decode failed: {rc}")

    rows = []
    for req in requests:
        prompt, reply = req["prompt"], req["reply"]
        n = len(prompt)
        n_past = next((i for i, (a, b) in enumerate(zip(held, prompt)) if a != b), min(len(held), n))
        row: dict = {"prompt": n, "lcp": n_past, "fallback": False, "restored": None}
        pos_next = n_past
        thold = max(0, n_past - n_swa - (0 if n_past < n else 1))
        if 0 < n_past <= len(held):
            row["pos_min"] = pmin = lib.llama_memory_seq_pos_min(mem, 0)
            if pmin >= thold:
                hit = next((c for c in reversed(ckpts) if c["pos_max"] <= n_past
                            and (c["pos_min"] < thold or c["pos_min"] == 0)), None)  # fmt: skip
                if hit is None:
                    row["fallback"], n_past, pos_next = True, 0, 0
                else:
                    got = lib.llama_state_seq_set_data_ext(
                        ctx, hit["data"], len(hit["data"]), 0, PARTIAL_ONLY
                    )
                    assert got == len(hit["data"]), "checkpoint restore failed"
                    pos_next = min(n_past, max(hit["pos_min"] + 1, hit["pos_max"]))
                    n_past = row["restored"] = min(pos_next, hit["n_tokens"])
        ckpts = [c for c in ckpts if c["pos_max"] <= pos_next]
        if n_past == n and n_past > 0:
            n_past -= 1
        lib.llama_memory_seq_rm(mem, 0, n_past, -1)
        row["evaluated"] = n - n_past
        done = n_past
        while done < n:  # the server's prompt batches and the checkpoints before them
            end = min(n, done + N_BATCH)
            for off in (4 + N_UBATCH, 4):
                if done < n - min(N_BATCH, off) < end:
                    end = n - min(N_BATCH, off)
                    break
            near_end = n < end + N_UBATCH
            pmin = lib.llama_memory_seq_pos_min(mem, 0)
            pmax = lib.llama_memory_seq_pos_max(mem, 0)
            if (
                (end == n or near_end)
                and pmin >= 0
                and (not ckpts or near_end or done > ckpts[-1]["n_tokens"] + CKPT_STEP)
            ):
                size = lib.llama_state_seq_get_size_ext(ctx, 0, PARTIAL_ONLY)
                data = ffi.new("uint8_t[]", size)
                lib.llama_state_seq_get_data_ext(ctx, data, size, 0, PARTIAL_ONLY)
                ckpts = [c for c in ckpts if c["n_tokens"] != done][-(N_CKPT - 1) :]
                ckpts.append({"n_tokens": done, "pos_min": pmin, "pos_max": pmax, "data": data})
            decode(prompt[done:end], done)
            done = end
        for i, t in enumerate(reply[:-1]):
            decode([t], n + i)
        held = prompt + reply[:-1]
        row["checkpoints"] = len(ckpts)
        row["checkpoint_bytes"] = len(ckpts[-1]["data"]) if ckpts else 0
        rows.append(row)
    lib.llama_free(ctx)
    return rows


def main() -> int:
    import cffi  # type: ignore[import-not-found]

    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    libdir = Path(sys.argv[1])
    ggml = ffi.dlopen(str(libdir / "libggml.v0.5.0.so"))
    lib = ffi.dlopen(str(libdir / "libllama.v0.5.0.so"))
    ggml.ggml_backend_load_all_from_path(str(libdir).encode())
    job = json.load(sys.stdin)
    lib.llama_backend_init()
    model = lib.llama_model_load_from_file(job["gguf"].encode(), lib.llama_model_default_params())
    if model == ffi.NULL:
        raise SystemExit(f"llama.cpp could not load {job['gguf']}")
    n_swa = lib.llama_model_n_swa(model)
    out: dict = {"n_swa": n_swa, "n_ctx": lib.llama_model_n_ctx_train(model), "sessions": {}}
    for name, requests in job["sessions"].items():
        out["sessions"][name] = session(ffi, lib, model, job, requests, n_swa)
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
