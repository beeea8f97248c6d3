"""Do CUDA graphs pay for decode?  One decode forward timed eagerly and replayed from a captured graph.

Called by ``benchmarks.gpu_bench`` with a loaded engine: sequences of ``context`` tokens on pages taken
from (and given back to) the engine's allocator after the prefix cache is emptied, so no cached K/V is overwritten.
The graph runs with the page-table width of the longest allowed sequence (what an engine would
capture), the eager forward with the batch's own width, so the comparison includes that cost too.
"""

from __future__ import annotations

import statistics
import time

import torch

from runtime.cuda_graph import GRAPH_BATCH_SIZES, DecodeGraphRunner
from runtime.engine import Engine
from runtime.forward_batch import ForwardBatch


def decode_batch(eng: Engine, pages: list[int], batch: int, context: int) -> ForwardBatch:
    """Row i decodes token ``context`` of a sequence whose K/V (random leftovers) lie on its own pages."""
    ps, dev = eng.cache.page_size, eng.device
    per_seq = context // ps + 1
    table = torch.tensor(pages[: batch * per_seq], dtype=torch.int32, device=dev).view(batch, per_seq)
    pos = torch.full((batch,), context, dtype=torch.long, device=dev)
    return ForwardBatch(
        input_ids=torch.randint(10, eng.runner.cfg.vocab_size, (batch,), device=dev),
        positions=pos,
        slot_mapping=table[:, context // ps].long() * ps + context % ps,
        cu_seqlens_q=torch.arange(batch + 1, dtype=torch.int32, device=dev),
        seq_lens_k=(pos + 1).to(torch.int32),
        page_table=table,
        logits_rows=torch.arange(batch, device=dev),
        is_decode=True,
    )


def median_ms(fn, device: torch.device, reps: int) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize(device)
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def bench_decode_graphs(eng: Engine, batches: list[int], context: int, reps: int = 20) -> dict:
    runner_ = eng.runner
    eng.reset_prefix_cache()  # the engine's own measurements are done: free the tree's pages for these
    per_seq = context // eng.cache.page_size + 1
    pages = eng.cache.allocator.alloc(max(batches) * per_seq)
    try:
        max_pages = -(-eng.max_model_len // eng.cache.page_size)
        graphs = DecodeGraphRunner(
            runner_.model, runner_.pool.layers, runner_.backend, max_pages, capture=True
        )
        t = time.perf_counter()
        graphs.capture_graphs()
        out: dict = {"capture_s": time.perf_counter() - t, "batch_sizes": list(GRAPH_BATCH_SIZES), "rows": []}
        for b in batches:
            fb = decode_batch(eng, pages, b, context)
            eager = runner_.model(fb, runner_.pool.layers, runner_.backend)
            diff = float((graphs.run(fb) - eager).abs().max())
            eager_ms = median_ms(
                lambda fb=fb: runner_.model(fb, runner_.pool.layers, runner_.backend), eng.device, reps
            )
            graph_ms = median_ms(lambda fb=fb, g=graphs: g.run(fb), eng.device, reps)
            out["rows"].append({"batch": b, "context": context, "eager_ms": eager_ms, "graph_ms": graph_ms,
                                "speedup": eager_ms / graph_ms, "max_abs_logit_diff": diff})  # fmt: skip
        return out
    finally:
        eng.cache.allocator.free(pages)
