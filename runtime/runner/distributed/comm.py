"""Rank 0 hands every step's flat batch to the other ranks: a header, then the batch's tensors.

Tensors, not Python objects: one broadcast of a fixed-size int64 header (the op, the bool flags,
then for every tensor field of ``ForwardBatch`` its dtype and shape), then one broadcast per
tensor field, in field order.  A field added to ``ForwardBatch`` travels without a change here
(tensors up to 2-D, bools).  ``op == STOP`` ends a worker's loop.
"""

from __future__ import annotations

import torch

from kvreuse.runtime.runner.forward_batch import ForwardBatch

STEP, STOP = 1, 0
_DTYPES = (torch.int64, torch.int32, torch.float32, torch.bfloat16, torch.float16, torch.bool)
_SLOTS = 4  # per field: kind (0 bool, 1 tensor), dtype code / bool value, dim 0, dim 1 (-1: 1-D)
_HEADER = 1 + _SLOTS * len(ForwardBatch._fields)


def _header(fb: ForwardBatch | None) -> torch.Tensor:
    head = torch.zeros(_HEADER, dtype=torch.int64)
    if fb is None:
        return head
    head[0] = STEP
    for i, value in enumerate(fb):
        s = 1 + _SLOTS * i
        if isinstance(value, torch.Tensor):
            if value.dim() > 2:
                raise ValueError(f"ForwardBatch.{fb._fields[i]} has {value.dim()} dims; comm sends up to 2")
            dims = list(value.shape) + [-1] * (2 - value.dim())
            head[s : s + 4] = torch.tensor([1, _DTYPES.index(value.dtype), *dims])
        else:
            head[s : s + 2] = torch.tensor([0, int(bool(value))])
    return head


def send_batch(fb: ForwardBatch | None, group, device: torch.device) -> None:
    """Rank 0: broadcast ``fb`` (None: tell the workers to stop)."""
    group.broadcast(_header(fb).to(device))
    if fb is not None:
        for value in fb:
            if isinstance(value, torch.Tensor) and value.numel():  # both sides know an empty one's shape
                group.broadcast(value.contiguous())


def recv_batch(group, device: torch.device) -> ForwardBatch | None:
    """Other ranks: the next step's batch, or None when rank 0 stops."""
    head = torch.empty(_HEADER, dtype=torch.int64, device=device)
    group.broadcast(head)
    h = head.tolist()
    if h[0] == STOP:
        return None
    values = []
    for i in range(len(ForwardBatch._fields)):
        kind, code, d0, d1 = h[1 + _SLOTS * i : 1 + _SLOTS * (i + 1)]
        if kind == 0:
            values.append(bool(code))
            continue
        t = torch.empty([d for d in (d0, d1) if d >= 0], dtype=_DTYPES[code], device=device)
        if t.numel():
            group.broadcast(t)
        values.append(t)
    return ForwardBatch(*values)
