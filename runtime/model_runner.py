"""Loads the model and the KV pool on a device and runs one forward per step."""

from __future__ import annotations

from pathlib import Path

import torch

from kernels import select_backend
from runtime.forward_batch import build_forward_batch
from runtime.kv_pool import KVPool
from runtime.models import build_model
from runtime.models.config import ModelConfig
from runtime.sampler import SampleResult, sample
from runtime.scheduler import Chunk
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
    """Our model plus its paged KV pool on one device."""

    def __init__(
        self,
        model_dir: Path,
        dtype: str,
        device: str,
        page_size: int,
        kv_cache_memory: int | None,
        num_pages: int | None = None,
        attention_backend: str = "auto",
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

    def step(self, chunks: list[Chunk]) -> tuple[torch.Tensor, SampleResult | None]:
        """Forward the chunks; sample for those that end their sequence. Returns (logits, samples)."""
        fb = build_forward_batch(
            [(c.req.tokens[c.start : c.start + c.length], c.start, c.req.pages) for c in chunks],
            [c.sample for c in chunks],
            self.page_size,
            self.device,
        )
        logits = self.model(fb, self.pool.layers, self.backend)
        sampled = [c.req for c in chunks if c.sample]
        if not sampled:
            return logits, None
        res = sample(
            logits, [r.params for r in sampled], [r.generator for r in sampled], [r.matcher for r in sampled]
        )
        return logits, res
