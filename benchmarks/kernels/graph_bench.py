"""Do CUDA graphs pay for decode?  One decode forward timed eagerly and replayed from a captured graph.

Called by ``kvreuse.benchmarks.kernels.gpu_bench`` once its engine is gone: a model runner of its own (this measures the
runner's forward, below the engine) with a pool of exactly the pages the batches need, sequences of
``context`` tokens on their own pages (random leftover K/V: only the time matters, and eager vs graph).
The graph runs with the page-table width of the longest allowed sequence (what an engine would
capture), the eager forward with the batch's own width, so the comparison includes that cost too.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from kvreuse.runtime.runner.cuda_graph import GRAPH_BATCH_SIZES, DecodeGraphRunner
from kvreuse.runtime.runner.forward_batch import ForwardBatch
from kvreuse.runtime.runner.model_runner import ModelRunner

PAGE_SIZE = 16


def decode_batch(runner: ModelRunner, pages: list[int], batch: int, context: int) -> ForwardBatch:
    """Row i decodes token ``context`` of a sequence whose K/V (random leftovers) lie on its own pages."""
    ps, dev = runner.page_size, runner.device
    per_seq = context // ps + 1
    table = torch.tensor(pages[: batch * per_seq], dtype=torch.int32, device=dev).view(batch, per_seq)
    pos = torch.full((batch,), context, dtype=torch.long, device=dev)
    return ForwardBatch(
        input_ids=torch.randint(10, runner.cfg.vocab_size, (batch,), device=dev),
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


def bench_decode_graphs(
    model_dir: Path,
    dtype: str,
    device: torch.device,
    max_model_len: int,
    batches: list[int],
    context: int,
    reps: int = 20,
) -> dict:
    per_seq = context // PAGE_SIZE + 1
    runner_ = ModelRunner(model_dir, dtype, str(device), PAGE_SIZE, None, num_pages=max(batches) * per_seq,
                          attention_backend="triton")  # fmt: skip
    pages = list(range(max(batches) * per_seq))
    max_pages = -(-max_model_len // PAGE_SIZE)
    graphs = DecodeGraphRunner(runner_.model, runner_.pool.layers, runner_.backend, max_pages, capture=True)
    t = time.perf_counter()
    graphs.capture_graphs()
    out: dict = {"capture_s": time.perf_counter() - t, "batch_sizes": list(GRAPH_BATCH_SIZES), "rows": []}
    for b in batches:
        fb = decode_batch(runner_, pages, b, context)
        eager = runner_.model(fb, runner_.pool.layers, runner_.backend)
        diff = float((graphs.run(fb) - eager).abs().max())
        eager_ms = median_ms(
            lambda fb=fb: runner_.model(fb, runner_.pool.layers, runner_.backend), device, reps
        )
        graph_ms = median_ms(lambda fb=fb, g=graphs: g.run(fb), device, reps)
        out["rows"].append({"batch": b, "context": context, "eager_ms": eager_ms, "graph_ms": graph_ms,
                            "speedup": eager_ms / graph_ms, "max_abs_logit_diff": diff})  # fmt: skip
    return out
