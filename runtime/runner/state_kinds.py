"""The kinds of per-request model state (``model_state.ModelState``), each decision about a kind here.

A model's config says which kind it needs: a hybrid's linear-attention layers a recurrent state, a
model with both sliding-window and full-attention layers window rings (when window paging is on and it
runs on one device; otherwise its window layers keep pool pages), any other none.  The runner builds
the chosen kind once; everything else reads its facts and calls its methods, never its name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from kvreuse.runtime.models.config import ModelConfig
from kvreuse.runtime.runner.model_state import ModelState, NoModelState
from kvreuse.runtime.runner.state_pool import StatePool
from kvreuse.runtime.runner.window_pool import WindowPool


class StateShape(NamedTuple):
    """What a kind's slots are built from: the model, how many requests run at once, the page size,
    the longest chunk a step runs, and where the tensors live."""

    cfg: ModelConfig
    slots: int
    page_size: int
    chunk_size: int
    dtype: torch.dtype
    device: torch.device


class StateKind(NamedTuple):
    """A kind of per-request model state: its name, what it is, and how to build it."""

    name: str
    about: str
    build: Callable[[StateShape], ModelState]


KINDS: dict[str, StateKind] = {
    k.name: k
    for k in (
        StateKind(
            "recurrent", "a hybrid's linear-attention states, one slot per running request",
            lambda s: StatePool(s.cfg, s.slots, s.dtype, s.device),
        ),
        StateKind(
            "window", "a sliding-window model's window layers on a ring of pages per running request",
            lambda s: WindowPool(s.cfg, s.slots, s.page_size, s.chunk_size, s.dtype, s.device),
        ),
        StateKind("none", "no per-request state beside the KV pages", lambda s: NoModelState()),
    )
}  # fmt: skip


def uses_rings(cfg: ModelConfig) -> bool:
    """Window layers go to rings when the model also has full-attention layers (whose pages the prefix
    cache keeps beside the window snapshots); a model windowed in every layer (Mistral) keeps all its
    KV in pool pages, so its prefix cache works as a dense model's."""
    return any(w is not None for w in cfg.windows) and any(w is None for w in cfg.windows)


def state_kind(cfg: ModelConfig, window_paging: bool, one_device: bool) -> StateKind:
    """The kind ``cfg``'s model needs (``window_paging``: ``--window-paging``; rings need ``one_device``)."""
    if cfg.is_hybrid:
        return KINDS["recurrent"]
    if window_paging and uses_rings(cfg) and one_device:
        return KINDS["window"]
    return KINDS["none"]


def make_model_state(shape: StateShape, window_paging: bool, one_device: bool) -> ModelState:
    """The per-request state slots of ``shape.cfg``'s model, of the kind it needs."""
    return state_kind(shape.cfg, window_paging, one_device).build(shape)
