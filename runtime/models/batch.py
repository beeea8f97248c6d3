"""What a model's forward reads: one flat varlen batch (built by ``kvreuse.runtime.runner.forward_batch``).

input_ids     [T]        tokens of seq0's chunk | seq1's chunk | ...
positions     [T]        absolute position of each token in its sequence
slot_mapping  [T]        KV pool slot (page * page_size + offset) each token's K/V goes to
cu_seqlens_q  [B+1]      chunk boundaries in the flat tensors
seq_lens_k    [B]        keys each sequence attends to after this step (cached + chunk)
page_table    [B, P]     each sequence's pages in order (padded with 0 past its length)
logits_rows   [S]        rows whose next-token logits are sampled (ends of finished prefills)
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class ForwardBatch(NamedTuple):
    """Tensors of one step; ``is_decode`` when every chunk is a single token."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seq_lens_k: torch.Tensor
    page_table: torch.Tensor
    logits_rows: torch.Tensor
    is_decode: bool
