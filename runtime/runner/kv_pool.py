"""The paged KV pool: one preallocated K and one V buffer per layer, sized from a memory budget."""

from __future__ import annotations

import torch

from kvreuse.runtime.models.config import ModelConfig

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
        num_layers: int | None = None,
    ) -> None:
        """``num_layers``: how many layers keep pages here (default: every attention layer; fewer when a
        model's window layers live in rings, ``runtime/runner/window_pool.py``)."""
        self.page_size = page_size
        elem = torch.tensor([], dtype=dtype).element_size()
        layers = cfg.num_attention_layers if num_layers is None else num_layers
        heads, head_dim = cfg.kv_shape(window=False)  # Gemma 4's full layers have their own head shape
        self.bytes_per_page = 2 * layers * heads * head_dim * elem * page_size
        if num_pages is None:
            budget = memory_bytes if memory_bytes is not None else default_kv_budget(device)
            num_pages = budget // self.bytes_per_page
        if num_pages < 1:
            raise ValueError(
                f"KV budget too small: one page of {page_size} tokens needs {self.bytes_per_page} bytes"
            )
        self.num_pages = int(num_pages)
        shape = (self.num_pages, page_size, heads, head_dim)
        self.layers = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(layers)
        ]

    def read_pages(self, pages: list[int]) -> torch.Tensor:
        """A host copy of whole pages' K/V: ``[n, layers, 2, page_size, kv_heads, head_dim]``."""
        idx = torch.tensor(list(pages), dtype=torch.long, device=self.layers[0][0].device)
        kv = torch.stack(
            [torch.stack((k.index_select(0, idx), v.index_select(0, idx))) for k, v in self.layers]
        )
        return kv.permute(2, 0, 1, 3, 4, 5).to("cpu").contiguous()

    def write_pages(self, pages: list[int], kv: torch.Tensor) -> None:
        """Fill whole pages from a tensor laid out as :meth:`read_pages` returns it."""
        dev = self.layers[0][0].device
        idx = torch.tensor(list(pages), dtype=torch.long, device=dev)
        kv = kv.to(dev, non_blocking=True)
        for layer, (k, v) in enumerate(self.layers):
            k.index_copy_(0, idx, kv[:, layer, 0].to(k.dtype))
            v.index_copy_(0, idx, kv[:, layer, 1].to(v.dtype))

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
