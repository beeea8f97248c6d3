"""Per-request model state beside the KV pages: one interface for the three kinds a model can have.

* recurrent state (``state_pool.StatePool``): a hybrid's linear-attention layers keep a state per
  request that cannot be cut at an arbitrary token;
* window rings (``window_pool.WindowPool``): a sliding-window model's window layers keep the last
  ``W + chunk`` keys per request in a ring instead of pages per token;
* none (``NoModelState``, here): a dense model, or window layers kept in pool pages.

``state_kinds.py`` chooses one from the model's config, once, where the runner is built; everything
else (runner, cache manager, engine, scoring) calls this interface or reads its facts, never asks
which kind it has (``tests/test_model_state_wall.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from kvreuse.kernels.backends import AttentionBackend
    from kvreuse.runtime.models.batch import ForwardBatch
    from kvreuse.runtime.models.config import ModelConfig
    from kvreuse.runtime.models.gated_deltanet import VerifyStash

KVLayers = list[tuple[torch.Tensor, torch.Tensor]]


class StateInput(NamedTuple):
    """A step's view of the state slots, per sequence: its slot, whether it starts from zero (token 0),
    offsets inside its chunk whose state to capture (into ``inside``, in order, all sequences), and
    a snapshot to fill with its state after the chunk (or None); ``verify``: the sequences whose
    chunk ends with a speculative draft, whose inputs the forward keeps for a rollback.  The
    snapshots are the kind's own (``state_pool.Snapshot``, ``window_pool.WindowSnapshot``)."""

    slots: list[int]
    fresh: list[bool]
    cuts: list[list[int]]
    inside: list
    ends: list
    verify: VerifyStash | None = None


class ModelState(ABC):
    """Slots of per-request model state for ``num_slots`` running requests, and the facts the engine
    reads about the kind (never its name):

    * ``keeps_snapshots``: the prefix cache keeps snapshots of it at page boundaries (a match must
      end at one; ``runtime/cache/state_slots.py``);
    * ``rolls_back``: a slot can be rolled back past a rejected speculative draft;
    * ``decode_graphs``: decode steps may replay CUDA graphs (no slots to address);
    * ``snapshot_store_share``: of the store's size, what its snapshot files may take (0: its
      snapshots never go below the pool);
    * ``splice_span``: how many positions before its end a snapshot holds, when snapshots taken
      elsewhere can be spliced into one (None: usable only where taken).
    """

    keeps_snapshots: bool
    rolls_back: bool
    layers: list
    decode_graphs: bool = False
    snapshot_store_share: float = 0.0
    splice_span: int | None = None
    num_slots: int
    snapshot_bytes: int
    nbytes: int  # every slot's tensors

    @property
    @abstractmethod
    def num_free(self) -> int: ...

    @abstractmethod
    def alloc(self) -> int:
        """A free slot (RuntimeError when all are in use)."""

    @abstractmethod
    def free(self, slot: int) -> None: ...

    @abstractmethod
    def kv_layers(self, cfg: ModelConfig, pool_layers: KVLayers) -> KVLayers:
        """Each attention layer's (k, v), given the pool's layers: a window layer's ring when the rings
        hold them, else its pool pages; a layer that reads another's KV (Gemma 4's shared tail) gets
        that layer's; a hybrid's are its full-attention layers' pages, in order."""

    @abstractmethod
    def run(
        self, model: torch.nn.Module, fb: ForwardBatch, kv_layers: KVLayers, backend: AttentionBackend,
        states: StateInput | None,
    ) -> torch.Tensor:  # fmt: skip
        """The model's forward over ``fb`` with the sequences' slots (``states``), filling the snapshots
        the step asked for; returns the logits of ``fb.logits_rows``."""

    # the snapshots' side, for a kind that ``keeps_snapshots`` (``runtime/cache/state_slots.py``)
    def empty_snapshot(self):
        """A snapshot to fill (the kind's own type)."""
        raise NotImplementedError(f"{type(self).__name__} takes no snapshots")

    def snapshot(self, slot: int):
        """A copy of ``slot``'s state now."""
        raise NotImplementedError(f"{type(self).__name__} takes no snapshots")

    def restore(self, slot: int, snap, end: int) -> None:
        """Put a snapshot taken at ``end`` back into ``slot``: its request resumes at ``end``."""
        raise NotImplementedError(f"{type(self).__name__} takes no snapshots")

    def kv_budget_left(self, kv_cache_memory: int) -> int:
        """What of ``--kv-cache-memory`` is left for the KV pool once the slots are paid for."""
        return kv_cache_memory

    def full_layers(self, cfg: ModelConfig) -> int | None:
        """How many layers the KV pool holds pages for (None: every cache layer)."""
        return None

    def chunk_limit(self, tokens: int) -> int:
        """The longest chunk of at most ``tokens`` one sequence may run in a step."""
        return tokens

    def keeps_on_tiers(self, shared: bool) -> bool:
        """Whether the host/disk tiers (``shared``: and the shared store) can keep what this kind's
        prefix cache holds."""
        return True


class NoModelState(ModelState):
    """A model without per-request state: slots cost nothing and the forward ignores them (so scoring
    and the runner run one code path)."""

    keeps_snapshots = False
    rolls_back = True
    decode_graphs = True
    num_slots = 0
    snapshot_bytes = 0
    nbytes = 0
    layers: list = []

    @property
    def num_free(self) -> int:
        return 1  # always one more: a slot is nothing

    def alloc(self) -> int:
        return 0

    def free(self, slot: int) -> None:
        pass

    def kv_layers(self, cfg: ModelConfig, pool_layers: KVLayers) -> KVLayers:
        check_pooled_windows(cfg)
        own = dict(zip(cfg.cache_layers, pool_layers))
        return [own[src] for src in cfg.kv_source]

    def run(self, model, fb, kv_layers, backend, states):
        return model(fb, kv_layers, backend)


def check_pooled_windows(cfg: ModelConfig) -> None:
    """Window layers kept in pool pages must have the full layers' KV shape."""
    if any(w is not None for w in cfg.windows) and cfg.kv_shape(True) != cfg.kv_shape(False):
        raise ValueError(
            f"{cfg.model_type}: its full and sliding layers' KV shapes differ, so its sliding layers"
            " need window rings (one device, window paging on)"
        )
