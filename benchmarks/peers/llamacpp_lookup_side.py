"""llama.cpp's side of ``kvreuse.benchmarks.serving.speculative``: decode time of scripted replies, plain and with prompt
lookup decoding as ``llama-cpp-python``'s ``LlamaPromptLookupDecoding`` drafts it.

Runs in a separate interpreter over the prebuilt CPU llama.cpp of the ``llama-cpp-cffi`` wheel (as
``benchmarks/peers/llamacpp_side.py`` does; setup in ``benchmarks/README.md``): llama-cpp-python has no wheel
for this platform, so its drafter (``find_candidate_pred_tokens``: the earliest earlier occurrence of
the last ``max_ngram_size`` .. 1 tokens, the ``num_pred_tokens`` after it; defaults 2 and 10) is ported
here line for line over numpy, and the verification loop is its ``Llama.generate``'s: one batch of the
last token + the draft with logits for every row, accepted up to the first mismatch, the rejected
positions removed from the KV cache (``llama_kv_self_seq_rm``).

Job on stdin: ``{"gguf", "threads", "prompts": [[ids]], "replies": [[ids]], "ngram", "k"}``; each reply
is forced (the target token at each row is the script's, as in our engine), the argmax still computed.
"""

from __future__ import annotations

import json
import sys
import time


def find_candidate_pred_tokens(np, input_ids, max_ngram_size: int, num_pred_tokens: int):
    """llama_cpp.llama_speculative.LlamaPromptLookupDecoding.find_candidate_pred_tokens."""
    input_length = input_ids.shape[0]
    for ngram_size in range(min(max_ngram_size, input_length - 1), 0, -1):
        windows = np.lib.stride_tricks.sliding_window_view(input_ids, (ngram_size,))
        ngram_array = input_ids[-ngram_size:]
        matches = np.all(windows == ngram_array, axis=1)
        for idx in np.nonzero(matches)[0]:
            start_idx = idx + ngram_size
            end_idx = min(start_idx + num_pred_tokens, input_length)
            if start_idx < end_idx:
                return input_ids[start_idx:end_idx]
    return np.array([], dtype=np.intc)


def main() -> int:
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    from _llama_cpp_cpu import ffi, lib  # type: ignore[import-not-found]
    from llamacpp_calls import load_model  # type: ignore[import-not-found]

    job = json.load(sys.stdin)
    lib.llama_backend_init()
    model = load_model(ffi, lib, job["gguf"])
    longest = max(len(p) + len(r) for p, r in zip(job["prompts"], job["replies"])) + 16
    cparams = lib.llama_context_default_params()
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = max(512, longest)
    cparams.n_threads = cparams.n_threads_batch = job["threads"]
    ctx = lib.llama_init_from_model(model, cparams)
    n_vocab = lib.llama_n_vocab(lib.llama_model_get_vocab(model))
    batch = lib.llama_batch_init(cparams.n_batch, 0, 1)

    def run(ids: list[int], pos: int, all_logits: bool) -> list[int]:
        """Evaluate ``ids`` at positions ``pos..``; the argmax of every row (or of the last)."""
        for i, t in enumerate(ids):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if all_logits or i == len(ids) - 1 else 0
        batch.n_tokens = len(ids)
        if lib.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        rows = range(len(ids)) if all_logits else [len(ids) - 1]
        return [
            int(
                np.frombuffer(
                    ffi.buffer(lib.llama_get_logits_ith(ctx, r), 4 * n_vocab), dtype=np.float32
                ).argmax()
            )
            for r in rows
        ]

    results = []
    for prompt, reply in zip(job["prompts"], job["replies"]):
        out = {}
        for mode in ("off", "lookup"):
            lib.llama_kv_self_clear(ctx)
            run(prompt, 0, False)
            tokens, steps, accepted = [reply[0]], 0, 0
            t0 = time.perf_counter()
            while len(tokens) < len(reply):
                pos = len(prompt) + len(tokens) - 1
                draft = []
                if mode == "lookup":
                    ids = np.array(prompt + tokens, dtype=np.intc)
                    draft = find_candidate_pred_tokens(np, ids, job["ngram"], job["k"]).tolist()
                    draft = draft[: len(reply) - len(tokens) - 1]
                run([tokens[-1]] + draft, pos, True)
                steps += 1
                n = 0
                while n < len(draft) and draft[n] == reply[len(tokens) + n]:
                    n += 1
                accepted += n
                tokens += reply[len(tokens) : len(tokens) + n + 1]  # the accepted drafts + the target
                lib.llama_kv_self_seq_rm(ctx, 0, pos + 1 + n, -1)  # rejected positions out of the cache
            out[mode] = {"decode_s": time.perf_counter() - t0, "tokens": len(tokens), "steps": steps,
                         "accepted": accepted}  # fmt: skip
        results.append(out)
    json.dump({"results": results, "threads": job["threads"]}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
