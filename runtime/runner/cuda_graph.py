"""CUDA graphs for decode steps: one captured forward per padded batch size, replayed from static buffers.

A decode step of a small model at a small batch is mostly kernel-launch latency (hundreds of launches
of microsecond kernels); replaying a captured graph issues them as one.  Graphs need fixed shapes and
addresses, so a step's tensors are copied into static buffers sized for the largest captured batch
and the page-table width of the longest allowed sequence, and the batch is padded up to the next
captured size.  Padding rows write nowhere (slot -1: the Triton ``store_kv`` skips negative slots) and
attend to nothing (0 keys: the Triton decode writes a zero output).  The Triton decode sizes its
splits from the page table's width, never from sequence lengths, so nothing in the step syncs to the
host and the capture is valid for every later step.

Only the Triton backend qualifies (the torch reference reads sequence lengths on the host and cannot
skip padding slots).  ``capture=False`` runs the same padded static-buffer forward eagerly, which is
how the padding logic is tested on CPU under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import torch

from kvreuse.kernels.backends import AttentionBackend
from kvreuse.runtime.models.decoder import CausalLM
from kvreuse.runtime.runner.forward_batch import ForwardBatch

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


class DecodeGraphRunner:
    """Runs decode forwards of ``model`` through static buffers, replaying CUDA graphs when captured."""

    def __init__(
        self,
        model: CausalLM,
        kv_layers: list[tuple[torch.Tensor, torch.Tensor]],
        backend: AttentionBackend,
        max_pages_per_seq: int,
        batch_sizes: tuple[int, ...] = GRAPH_BATCH_SIZES,
        capture: bool | None = None,
    ) -> None:
        if backend.name != "triton":
            raise ValueError(f"decode graphs need the triton attention backend, not {backend.name!r}")
        self.model, self.kv_layers, self.backend = model, kv_layers, backend
        self.device = model.embed_tokens.weight.device
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.batch_sizes = tuple(sorted(set(batch_sizes)))
        self.max_pages = max_pages_per_seq
        n = self.batch_sizes[-1]

        def zeros(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=self.device)

        self.input_ids, self.positions = zeros(n), zeros(n)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=self.device)
        self.seq_lens_k = zeros(n, dtype=torch.int32)
        self.page_table = zeros(n, max_pages_per_seq, dtype=torch.int32)
        self.cu_seqlens_q = torch.arange(n + 1, dtype=torch.int32, device=self.device)
        self.logits_rows = torch.arange(n, device=self.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def static_batch(self, bs: int) -> ForwardBatch:
        """The padded decode batch of ``bs`` rows that views the static buffers."""
        return ForwardBatch(
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            slot_mapping=self.slot_mapping[:bs],
            cu_seqlens_q=self.cu_seqlens_q[: bs + 1],
            seq_lens_k=self.seq_lens_k[:bs],
            page_table=self.page_table[:bs],
            logits_rows=self.logits_rows[:bs],
            is_decode=True,
        )

    def padded_size(self, batch: int) -> int | None:
        return next((bs for bs in self.batch_sizes if bs >= batch), None)

    def can_run(self, fb: ForwardBatch) -> bool:
        """A decode step that samples every row and fits the buffers."""
        b = fb.input_ids.shape[0]
        return (
            fb.is_decode
            and self.padded_size(b) is not None
            and fb.page_table.shape[1] <= self.max_pages
            and fb.logits_rows.shape[0] == b
        )

    def capture_graphs(self) -> None:
        """Capture every batch size, largest first so smaller graphs reuse its memory pool."""
        if not self.capture:
            return
        pool = None
        stream = torch.cuda.Stream(self.device)
        for bs in reversed(self.batch_sizes):
            fb = self.static_batch(bs)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):  # warm-up off the capture: Triton compiles, allocators settle
                self.model(fb, self.kv_layers, self.backend)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = self.model(fb, self.kv_layers, self.backend)
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize(self.device)

    def run(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits ``[B, vocab]`` of a decode step; a view of a static buffer, valid until the next run."""
        if not self.can_run(fb):
            raise ValueError("not a decode step these buffers can hold")
        b, width = fb.input_ids.shape[0], fb.page_table.shape[1]
        bs = self.padded_size(b)
        self.input_ids[:b].copy_(fb.input_ids)
        self.positions[:b].copy_(fb.positions)
        self.slot_mapping[:b].copy_(fb.slot_mapping)
        self.seq_lens_k[:b].copy_(fb.seq_lens_k)
        self.page_table[:b, :width].copy_(fb.page_table)
        self.page_table[:b, width:].zero_()
        # padding rows: token 0 at position 0, stored nowhere, attending to no key
        self.input_ids[b:bs].zero_()
        self.positions[b:bs].zero_()
        self.slot_mapping[b:bs].fill_(-1)
        self.seq_lens_k[b:bs].zero_()
        if bs in self.graphs:
            self.graphs[bs].replay()
            return self.outputs[bs][:b]
        return self.model(self.static_batch(bs), self.kv_layers, self.backend)[:b]
