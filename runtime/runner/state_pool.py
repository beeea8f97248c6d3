"""Per-request state of a hybrid model's linear-attention layers: one slot per running request.

Each Gated DeltaNet layer keeps, per sequence, a recurrent state ``[v_heads, k_dim, v_dim]`` (fp32,
as fla keeps it: it accumulates over the whole sequence) and the last ``kernel - 1`` inputs of its
short convolution ``[conv_dim, kernel - 1]`` (model dtype).  Unlike KV pages they cannot be cut at
an arbitrary token, so the prefix cache keeps copies (``Snapshot``) at chosen page boundaries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from kvreuse.kernels.linear_attention import select_linear_backend
from kvreuse.runtime.models.gated_deltanet import StateBatch
from kvreuse.runtime.runner.model_state import KVLayers, ModelState, StateInput, check_pooled_windows

if TYPE_CHECKING:
    from kvreuse.kernels.backends import AttentionBackend
    from kvreuse.runtime.models.batch import ForwardBatch
    from kvreuse.runtime.models.config import ModelConfig


class Snapshot(NamedTuple):
    """Every linear layer's state after some prefix: conv ``[layers, C, K-1]``, rec ``[layers, Hv, Dk, Dv]``."""

    conv: torch.Tensor
    rec: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.rec.nbytes


class StatePool(ModelState):
    """``conv[layer, slot]`` and ``rec[layer, slot]`` for ``num_slots`` requests; ``layers[i]`` is layer i's pair.

    The prefix cache keeps its snapshots (a match ends at one); a rejected draft is rolled back by
    replaying the kept inputs (``runtime/models/gated_deltanet.py``); no tier below the pool keeps
    its snapshots yet; a snapshot is usable only where it was taken (``splice_span`` None)."""

    keeps_snapshots = True
    rolls_back = True

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
        self.linear_backend = select_linear_backend(device)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.rec.nbytes

    @property
    def snapshot_bytes(self) -> int:
        return (self.conv.nbytes + self.rec.nbytes) // self.num_slots

    def kv_layers(self, cfg: ModelConfig, pool_layers: KVLayers) -> KVLayers:
        check_pooled_windows(cfg)
        return list(pool_layers)

    def keeps_on_tiers(self, shared: bool) -> bool:
        return False

    def run(
        self, model: torch.nn.Module, fb: ForwardBatch, kv_layers: KVLayers, backend: AttentionBackend,
        states: StateInput | None,
    ) -> torch.Tensor:  # fmt: skip
        """Forward over the sequences' state slots, filling the snapshots the step asked for."""
        assert states is not None, "a hybrid's step needs its state slots"
        device = self.conv.device
        sb = StateBatch(
            self.linear_backend,
            torch.tensor(states.slots, device=device),
            torch.tensor(states.fresh, device=device),
            fb.cu_seqlens_q.tolist(),
            states.cuts,
            states.inside,
            states.verify,
        )
        logits = model(fb, kv_layers, backend, self.layers, sb)
        for slot, snap in zip(states.slots, states.ends):
            if snap is not None:  # the state after the whole chunk
                self.copy_to(slot, snap)
        return logits

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
