"""Per-request state of a hybrid model's linear-attention layers: one slot per running request.

Each Gated DeltaNet layer keeps, per sequence, a recurrent state ``[v_heads, k_dim, v_dim]`` (fp32,
as fla keeps it: it accumulates over the whole sequence) and the last ``kernel - 1`` inputs of its
short convolution ``[conv_dim, kernel - 1]`` (model dtype).  Unlike KV pages they cannot be cut at
an arbitrary token, so the prefix cache keeps copies (``Snapshot``) at chosen page boundaries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

if (
    TYPE_CHECKING
):  # kvreuse.runtime.runner.forward_batch imports this module, and the models import forward_batch
    from kvreuse.runtime.models.config import ModelConfig
    from kvreuse.runtime.models.gated_deltanet import VerifyStash


class Snapshot(NamedTuple):
    """Every linear layer's state after some prefix: conv ``[layers, C, K-1]``, rec ``[layers, Hv, Dk, Dv]``."""

    conv: torch.Tensor
    rec: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.rec.nbytes


class StateInput(NamedTuple):
    """A step's view of the state pool, per sequence: its slot, whether it starts from zero (token 0),
    offsets inside its chunk whose state to capture (into ``inside``, in order, all sequences), and
    a snapshot to fill with its state after the chunk (or None); ``verify``: the sequences whose
    chunk ends with a speculative draft, whose inputs the forward keeps for a rollback."""

    slots: list[int]
    fresh: list[bool]
    cuts: list[list[int]]
    inside: list[Snapshot]
    ends: list[Snapshot | None]
    verify: VerifyStash | None = None


class StatePool:
    """``conv[layer, slot]`` and ``rec[layer, slot]`` for ``num_slots`` requests; ``layers[i]`` is layer i's pair."""

    splice_span = None  # a recurrent state is usable only where it was taken

    def __init__(self, cfg: ModelConfig, num_slots: int, dtype: torch.dtype, device: torch.device) -> None:
        lc = cfg.linear_attn
        assert lc is not None, "a state pool is for hybrid models"
        n = sum(t == "linear_attention" for t in cfg.layer_types)
        self.num_slots = num_slots
        self.conv = torch.zeros(n, num_slots, lc.conv_dim, lc.conv_kernel - 1, dtype=dtype, device=device)
        self.rec = torch.zeros(
            n, num_slots, lc.num_v_heads, lc.k_head_dim, lc.v_head_dim, dtype=torch.float32, device=device
        )
        self.layers = [(self.conv[i], self.rec[i]) for i in range(n)]
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def snapshot_bytes(self) -> int:
        return (self.conv.nbytes + self.rec.nbytes) // self.num_slots

    def alloc(self) -> int:
        if not self._free:
            raise RuntimeError(f"all {self.num_slots} linear-attention state slots are in use")
        return self._free.pop()

    def free(self, slot: int) -> None:
        self._free.append(slot)

    def snapshot(self, slot: int) -> Snapshot:
        return Snapshot(self.conv[:, slot].clone(), self.rec[:, slot].clone())

    def empty_snapshot(self) -> Snapshot:
        return Snapshot(torch.empty_like(self.conv[:, 0]), torch.empty_like(self.rec[:, 0]))

    def copy_to(self, slot: int, snap: Snapshot) -> None:
        snap.conv.copy_(self.conv[:, slot])
        snap.rec.copy_(self.rec[:, slot])

    def restore(self, slot: int, snap: Snapshot, end: int = 0) -> None:
        """``end`` (where the snapshot was taken) is the window pool's concern, not a recurrent state's."""
        self.conv[:, slot].copy_(snap.conv)
        self.rec[:, slot].copy_(snap.rec)
