"""Loads the model and the KV pool on a device and runs one forward per step."""

from __future__ import annotations

from pathlib import Path

import torch

from kernels import select_backend
from kernels.linear_attention import select_linear_backend
from runtime.forward_batch import ForwardBatch, build_forward_batch
from runtime.hybrid_states import HybridStates
from runtime.kv_pool import KVPool
from runtime.models import build_model
from runtime.models.config import ModelConfig
from runtime.models.gated_deltanet import StateBatch
from runtime.sampler import SampleResult, sample
from runtime.scheduler import Chunk
from runtime.state_pool import StatePool
from runtime.weights import load_weights

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_dtype(device: torch.device) -> str:
    """bf16 on GPUs; on CPUs only where bf16 matmuls are native (AMX / AVX512-BF16), else fp32."""
    if device.type == "cuda":
        return "bfloat16"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "float32"
    return "bfloat16" if ("amx_bf16" in flags or "avx512_bf16" in flags) else "float32"


class ModelRunner:
    """Our model plus its paged KV pool on one device (and a hybrid's linear-attention state pool)."""

    states: HybridStates | None = None  # set by the engine for hybrids: slots and snapshot policy

    def __init__(
        self,
        model_dir: Path,
        dtype: str,
        device: str,
        page_size: int,
        kv_cache_memory: int | None,
        num_pages: int | None = None,
        attention_backend: str = "auto",
        state_slots: int = 64,
    ) -> None:
        self.device = torch.device(device)
        self.dtype = DTYPES[dtype]
        self.cfg = ModelConfig.from_dir(model_dir)
        self.model = build_model(self.cfg, self.device, self.dtype)
        load_weights(self.model, model_dir)
        self.model.prepare()
        self.model.eval()
        self.pool = KVPool(self.cfg, page_size, self.dtype, self.device, kv_cache_memory, num_pages)
        self.backend = select_backend(self.device, attention_backend)
        self.page_size = page_size
        self.state_pool = (
            StatePool(self.cfg, state_slots, self.dtype, self.device) if self.cfg.is_hybrid else None
        )
        self.linear_backend = select_linear_backend(self.device) if self.cfg.is_hybrid else None

    def step(self, chunks: list[Chunk]) -> tuple[torch.Tensor, SampleResult | None]:
        """Forward the chunks; sample for those that end their sequence. Returns (logits, samples)."""
        fb = build_forward_batch(
            [(c.req.tokens[c.start : c.start + c.length], c.start, c.req.pages) for c in chunks],
            [c.sample for c in chunks],
            self.page_size,
            self.device,
        )
        if self.state_pool is None:
            logits = self.model(fb, self.pool.layers, self.backend)
        else:
            logits = self._hybrid_forward(fb, chunks)
        sampled = [c.req for c in chunks if c.sample]
        if not sampled:
            return logits, None
        res = sample(logits, [r.params for r in sampled], [r.generator for r in sampled])
        return logits, res

    def _hybrid_forward(self, fb: ForwardBatch, chunks: list[Chunk]) -> torch.Tensor:
        """Forward with each request's state slot; capture the snapshots the policy asks for."""
        states, pool = self.states, self.state_pool
        assert states is not None and pool is not None and self.linear_backend is not None
        cuts, ends, captures, inside = [], [], [], []
        for c in chunks:
            decode = c.length == 1 and c.start >= c.req.num_prompt
            cut, at_end = states.cuts(c.start, c.length, decode)
            cuts.append(cut)
            ends.append(at_end)
            for off in cut:
                snap = pool.empty_snapshot()
                captures.append(snap)
                inside.append((c.req, c.start + off, snap, decode))
        sb = StateBatch(
            self.linear_backend,
            torch.tensor([states.slot(c.req) for c in chunks], device=self.device),
            torch.tensor([c.start == 0 for c in chunks], device=self.device),
            fb.cu_seqlens_q.tolist(),
            cuts,
            captures,
        )
        logits = self.model(fb, self.pool.layers, self.backend, pool.layers, sb)
        for req, n, snap, decode in inside:
            states.captured(req, n, snap, decode)
        for c, at_end in zip(chunks, ends):
            if at_end:
                decode = c.length == 1 and c.start >= c.req.num_prompt
                states.captured(c.req, c.start + c.length, pool.snapshot(states.slot(c.req)), decode)
        return logits
