"""A step's input (``StepInput``: chunks and sampling) and the flat varlen ``ForwardBatch`` built from it
(``runtime/models/batch.py``: what a single model forward computes).

Every scheduled sequence contributes its next chunk of tokens (a prompt chunk or one
decode token) to flat tensors without padding::

    input_ids     [T]        tokens of seq0's chunk | seq1's chunk | ...
    positions     [T]        absolute position of each token in its sequence
    slot_mapping  [T]        KV pool slot (page * page_size + offset) each token's K/V goes to
    cu_seqlens_q  [B+1]      chunk boundaries in the flat tensors
    seq_lens_k    [B]        keys each sequence attends to after this step (cached + chunk)
    page_table    [B, P]     each sequence's pages in order (padded with 0 past its length)
    logits_rows   [S]        rows whose next-token logits are sampled (ends of finished prefills; a
                             speculating decode's last token and every drafted one)
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kvreuse.runtime.models.batch import ForwardBatch
from kvreuse.runtime.runner.model_state import StateInput
from kvreuse.runtime.sampling.constrained.matcher import Matcher
from kvreuse.runtime.sampling.draws import Draws
from kvreuse.runtime.sampling.params import SamplingParams


class SeqChunk(NamedTuple):
    """One sequence's part of a step: token ids computed now, their first position, its pages."""

    tokens: list[int]
    start: int
    pages: list[int]


class StepInput(NamedTuple):
    """What the model runner runs in one step: the chunks, and how to sample the rows that end a sequence.

    ``params`` / ``draws`` have one entry per ``True`` in ``sample_mask``, in order.
    ``drafts``: per sampled sequence, the drafted tokens its chunk ends with (``runtime/speculative``):
    such a sequence's ``sample_mask`` entry is the number of rows to sample, ``1 + len(draft)``.
    ``states``: a hybrid model's state slots and snapshot captures (``kvreuse.runtime.runner.state_pool.StateInput``).
    """

    seqs: list[SeqChunk]
    sample_mask: list[bool]
    params: list[SamplingParams]
    draws: list[Draws | None]  # each sampled row's randomness at its output position
    states: StateInput | None = None
    matchers: list[Matcher | None] | None = (
        None  # grammar state per sampled row (runtime/sampling/constrained)
    )
    drafts: list[list[int]] | None = None  # None: no sequence drafted this step


def build_forward_batch(
    chunks: list[SeqChunk] | list[tuple[list[int], int, list[int]]],
    sample_mask: list[bool] | list[int],
    page_size: int,
    device: torch.device,
    drafts_as_decode: bool = False,
) -> ForwardBatch:
    """``chunks``: per sequence (chunk token ids, start position, pages covering start+len tokens);
    ``sample_mask``: per sequence, how many of its last positions' logits are wanted (a bool: 0 or 1).

    ``drafts_as_decode``: when every row of every chunk is sampled (decodes, some verifying a draft),
    each row becomes a decode row of its own (its keys: the sequence's up to and including it, the
    rows before it stored by the same step).  The step then runs as plain decode does, row for row
    (the decode kernels compute each row alone), so a verified token has the very logits it would
    have had decoded alone: greedy output stays identical with quantized activations (the int4 and
    Q8_0 kernels), where the extend path's other summation order could flip an activation's int8
    rounding.  Not for models with per-sequence state (hybrids, window rings)."""
    if drafts_as_decode and all(int(m) == len(c[0]) for c, m in zip(chunks, sample_mask)):
        chunks = [
            ([tok], start + j, pages) for tokens, start, pages in chunks for j, tok in enumerate(tokens)
        ]
        sample_mask = [1] * len(chunks)
    ids: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    cu = [0]
    lens_k: list[int] = []
    rows: list[int] = []
    max_pages = max(len(p) for _, _, p in chunks)
    table = torch.zeros(len(chunks), max_pages, dtype=torch.int32)
    for i, (tokens, start, pages) in enumerate(chunks):
        n = len(tokens)
        ids.extend(tokens)
        p = range(start, start + n)
        pos.extend(p)
        slots.extend(pages[x // page_size] * page_size + x % page_size for x in p)
        cu.append(cu[-1] + n)
        lens_k.append(start + n)
        table[i, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        rows.extend(range(cu[-1] - int(sample_mask[i]), cu[-1]))

    def t(x: list[int], dtype: torch.dtype = torch.long) -> torch.Tensor:
        return torch.tensor(x, dtype=dtype, device=device)

    return ForwardBatch(
        input_ids=t(ids),
        positions=t(pos),
        slot_mapping=t(slots),
        cu_seqlens_q=t(cu, torch.int32),
        seq_lens_k=t(lens_k, torch.int32),
        page_table=table.to(device),
        logits_rows=t(rows),
        is_decode=all(len(c[0]) == 1 for c in chunks),
    )
