"""What the llama.cpp side scripts (``llamacpp_*_side.py``) do alike over llama.cpp's C API: load a
model, match a prompt against a context's tokens as llama-server's slot does, decode in batches.

Plain functions over the caller's ``ffi`` and ``lib`` (cffi handles to whichever llama.cpp build
it loaded): the side scripts run in a separate interpreter without kvreuse, and import this module
as their sibling file.
"""

from __future__ import annotations


def load_model(ffi, lib, gguf: str):
    """The model at ``gguf`` (after the caller's ``llama_backend_init``); a one-line exit when llama.cpp
    cannot load it."""
    model = lib.llama_model_load_from_file(gguf.encode(), lib.llama_model_default_params())
    if model == ffi.NULL:
        raise SystemExit(f"llama.cpp could not load {gguf}")
    return model


def common_prefix(held: list[int], prompt: list[int]) -> int:
    """llama-server's ``n_past``: how many leading tokens of ``prompt`` the context already holds."""
    return next((i for i, (a, b) in enumerate(zip(held, prompt)) if a != b), min(len(held), len(prompt)))


def decode(lib, ctx, ids: list[int], pos: int, n_batch: int) -> None:
    """``ids`` into sequence 0 at positions ``pos..``, in batches of ``n_batch`` with logits on each
    batch's last token (llama-server's prompt processing)."""
    for s in range(0, len(ids), n_batch):
        part = ids[s : s + n_batch]
        batch = lib.llama_batch_init(len(part), 0, 1)
        batch.n_tokens = len(part)
        for i, t in enumerate(part):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos + s + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, i == len(part) - 1
        rc = lib.llama_decode(ctx, batch)
        lib.llama_batch_free(batch)
        if rc != 0:
            raise SystemExit(f"llama_decode failed: {rc}")
