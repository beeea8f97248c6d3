"""A model's state slots as the engine sets them up: a hybrid's linear-attention states or a window
model's rings, the byte budget of their snapshots on the prefix cache's nodes, and where a window
model's snapshots go below the pool."""

from __future__ import annotations

from pathlib import Path

from kvreuse.runtime.cache.registry import cache_kind
from kvreuse.runtime.cache.state_slots import NoStateSlots, StateSlots
from kvreuse.runtime.cache.store.states import StateTier
from kvreuse.runtime.engine.admission import EngineError
from kvreuse.runtime.engine.config import EngineConfig
from kvreuse.runtime.models.quantize import verifies_per_row
from kvreuse.runtime.runner.model_runner import ModelRunner

DEFAULT_SNAPSHOT_BYTES = 1 << 30
RECORDS_STORE_SHARE = 0.05  # of --kv-store-size: the stored responses' file (the server's records)


def state_slots(runner: ModelRunner, cfg: EngineConfig) -> tuple[StateSlots | NoStateSlots, int | None]:
    """The running requests' slots of the model's per-request state, and the byte budget of their
    snapshots on the prefix cache's nodes (None for a kind that keeps none; snapshots are taken only
    when a prefix cache keeps them)."""
    if not runner.state_pool.keeps_snapshots:  # the kind's fact, as make_prefix_cache reads its kind's
        return NoStateSlots(), None
    budget = cfg.snapshot_memory if cfg.snapshot_memory is not None else DEFAULT_SNAPSHOT_BYTES
    keep = cache_kind(cfg.prefix_cache).keeps_prefixes
    return StateSlots(runner.state_pool, cfg.page_size, keep, cfg.snapshot_every), budget


def snapshot_policy(runner: ModelRunner, cfg: EngineConfig) -> tuple[int, int, int] | None:
    """Where the engine takes state snapshots, ``(page_size, chunk_size, every_pages)``
    (``runtime/cache/state_slots.py``), so a benchmark can predict the reuse; None for a model whose
    state keeps no snapshots, or without a prefix cache."""
    if not runner.state_pool.keeps_snapshots or not cache_kind(cfg.prefix_cache).keeps_prefixes:
        return None
    return cfg.page_size, cfg.chunk_size, cfg.snapshot_every


def records_budget(cfg: EngineConfig) -> int:
    """The bytes of ``--kv-store-size`` the server's stored responses may take (their file beside the
    pages), kept out of the pages' budget so the store stays within its size."""
    return int(int(cfg.kv_store_size) * RECORDS_STORE_SHARE)


def store_budgets(runner: ModelRunner, cfg: EngineConfig) -> tuple[int, int]:
    """``--kv-store-size`` less the records' share (``records_budget``), split into (pages, window
    snapshot files): all pages but for a kind whose snapshots go below the pool (a window model's)."""
    size = int(cfg.kv_store_size) - records_budget(cfg)
    snapshots = int(size * runner.state_pool.snapshot_store_share)
    return size - snapshots, snapshots


def snapshot_tier(runner: ModelRunner, cfg: EngineConfig) -> StateTier | None:
    """Where a window model's snapshots go below the pool: beside its pages in host memory (the host
    tier's budget again) and in the store's folder, within its share of the store's size.  None for a
    kind whose snapshots stay in the pool (no share of the store)."""
    pool = runner.state_pool
    if not pool.snapshot_store_share:
        return None
    folder = Path(cfg.kv_store) / "window_states" if cfg.kv_store else None
    disk_bytes = store_budgets(runner, cfg)[1]
    return StateTier(
        cfg.kv_host_memory or 0, folder, pool.snapshot_to_host, pool.snapshot_from_host, disk_bytes
    )


def speculative_mode(runner: ModelRunner, cfg: EngineConfig) -> str:
    """The draft source: as asked, or for ``auto`` the one that measured best on the agent workloads
    (``suffix``: benchmarks/serving/speculative.py) on a model that can roll a rejected draft back and whose
    linears verify a draft at about a decode step's cost (dense, or int4 through ``q4_linear.c``: on
    the embedded Q4_1 GGUF, bf16, suffix measured 2.2x of off on repeated tool JSON and 1.8x on a
    summary, results/speculative_gguf_bf16.json), else ``off``: torch's int8 kernel costs a row per
    drafted token, and a window-paged model's rings have no rollback.  Hybrids roll their
    linear-attention state back and draft too: on the random Qwen3.5 "cpu" shape (bf16, one thread;
    results/speculative_hybrid.json) suffix measured 3.0-3.1x of off at batch 1 on a rewritten file
    and on repeated tool JSON, 1.1x on the JSON at batch 8; below off at batch 8 on the rewrite (0.88x,
    where ngram with the same drafts gave 1.19x) and a summary (0.83x), and on free chat
    (0.93-0.97x): the agent workloads' gains outweigh these.
    """
    if cfg.speculative != "auto":
        return cfg.speculative
    rolls_back = runner.state_pool.rolls_back
    return "suffix" if rolls_back and verifies_per_row(runner.model) else "off"


def check_state_support(runner: ModelRunner, cfg: EngineConfig) -> None:
    """Refuse (EngineError) what a model with state slots cannot do yet."""
    state = runner.state_pool
    if cfg.speculative not in ("off", "auto") and not state.rolls_back:
        raise EngineError(
            "--speculative does not work with window-paged models yet: their window rings have no "
            "rollback for a rejected draft (--no-window-paging keeps the window layers' KV in pages)"
        )
    if cfg.tiered and not state.keeps_on_tiers(shared=bool(cfg.kv_shared_store)):
        raise EngineError(
            "--kv-shared-store does not keep hybrid or sliding-window models' snapshots yet, nor "
            "--kv-store / --kv-host-memory a hybrid's (--no-window-paging keeps a window model's KV in "
            "pages every tier can hold)"
        )
