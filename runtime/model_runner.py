"""Loads the model and the KV pool on a device and runs one forward per step."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

from kernels import select_backend
from runtime.forward_batch import StepInput, build_forward_batch
from runtime.kv_pool import KVPool
from runtime.models import build_model
from runtime.models.config import ModelConfig
from runtime.sampler import SampleResult, sample
from runtime.weights import load_weights


class StepResult(NamedTuple):
    """Logits of the sampled rows (``[S, vocab]``) and the tokens drawn from them (None if S == 0)."""

    logits: torch.Tensor
    samples: SampleResult | None


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

    def step(self, batch: StepInput) -> StepResult:
        """Forward the chunks; sample the rows that end their sequence."""
        fb = build_forward_batch(batch.seqs, batch.sample_mask, self.page_size, self.device)
        logits = self.model(fb, self.pool.layers, self.backend)
        samples = sample(logits, batch.params, batch.generators) if batch.params else None
        return StepResult(logits, samples)
