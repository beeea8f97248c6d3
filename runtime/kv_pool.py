"""The paged KV pool: one preallocated K and one V buffer per layer, sized from a memory budget."""

from __future__ import annotations

import torch

from runtime.models.config import ModelConfig

DEFAULT_CPU_KV_BYTES = 1 << 30  # 1 GiB: ~18K tokens of SmolLM2-135M in fp32
DEFAULT_GPU_FRACTION = 0.85  # of the memory free after the weights are loaded


class KVPool:
    """``k[layer]``/``v[layer]``: ``[num_pages, page_size, kv_heads, head_dim]``; a slot is page*page_size+offset."""

    def __init__(
        self,
        cfg: ModelConfig,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device,
        memory_bytes: int | None = None,
        num_pages: int | None = None,
    ) -> None:
        self.page_size = page_size
        elem = torch.tensor([], dtype=dtype).element_size()
        self.bytes_per_page = cfg.kv_bytes_per_token(elem) * page_size
        if num_pages is None:
            budget = memory_bytes if memory_bytes is not None else default_kv_budget(device)
            num_pages = budget // self.bytes_per_page
        if num_pages < 1:
            raise ValueError(
                f"KV budget too small: one page of {page_size} tokens needs {self.bytes_per_page} bytes"
            )
        self.num_pages = int(num_pages)
        shape = (self.num_pages, page_size, cfg.num_kv_heads, cfg.head_dim)
        self.layers = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(cfg.num_attention_layers)
        ]

    @property
    def num_tokens(self) -> int:
        return self.num_pages * self.page_size

    @property
    def nbytes(self) -> int:
        return self.num_pages * self.bytes_per_page


def default_kv_budget(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * DEFAULT_GPU_FRACTION)
    return DEFAULT_CPU_KV_BYTES


def parse_memory(text: str | int | None) -> int | None:
    """``"512M"``, ``"2G"``, ``"1073741824"`` -> bytes."""
    if text is None or isinstance(text, int):
        return text
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in "KMG" else t
    try:
        return int(float(num) * mult)
    except ValueError:
        raise ValueError(f"bad memory size {text!r} (use e.g. 512M or 2G)") from None
