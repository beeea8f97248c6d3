"""The JSON behind the live page: a tenant's new request records, its pins, the tiers' occupancy."""

from __future__ import annotations

import time
from typing import Any

import torch

from kvreuse.runtime.cache.store.shared import public_url
from kvreuse.runtime.engine.engine import EngineStats
from kvreuse.runtime.server.cache_info import CacheSnapshot, describe
from kvreuse.runtime.server.state import ServerState


def tiers(stats: EngineStats, snap: CacheSnapshot | None, page_bytes: int, host_budget: int | None,
          disk_budget: int | None, shared_url: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Pool pages by holder, the host tier's pages against its budget, the disk tier's bytes against its
    budget, the shared tier's traffic and why it is off now (``None``: that tier is not configured)."""
    pinned = snap.pages["pinned"] if snap is not None else 0
    pool = {
        "total": stats.total_pages, "free": stats.free_pages, "in_use": stats.request_pages,
        "pinned": pinned, "cached": stats.tree_pages - pinned,
    }  # fmt: skip
    host = (
        None
        if not host_budget
        else {"pages": stats.host_tier_pages, "capacity_pages": host_budget // page_bytes}
    )
    disk = None if disk_budget is None else {
        "pages": stats.disk_tier_pages, "bytes": stats.disk_tier_bytes, "budget_bytes": disk_budget,
    }  # fmt: skip
    shared = None if not shared_url else {
        "url": public_url(shared_url), "written_pages": stats.shared_written_pages,
        "loaded_tokens": stats.shared_loaded_tokens, "failures": stats.shared_failures,
        "degraded": stats.shared_error or None,
    }  # fmt: skip
    return {"page_bytes": page_bytes, "pool": pool, "host": host, "disk": disk, "shared": shared}


def own_tiers(cache: dict[str, Any], page_bytes: int) -> dict[str, Any]:
    """A tenant's view of the tiers: the pool's size and its own pinned pages (as its ``/v1/cache``);
    the pool's free, cached and in-use pages, the lower tiers' occupancy and the shared tier's traffic
    move with other tenants' requests, so they are the operator's (``scope: own``)."""
    pages = cache.get("pages") or {}
    pool = {"total": pages.get("total"), "pinned": pages.get("pinned", 0)}
    return {
        "page_bytes": page_bytes,
        "scope": "own",
        "pool": pool,
        "host": None,
        "disk": None,
        "shared": None,
    }


def page_bytes(engine) -> int:
    """One KV page's bytes (the engine's dtype may be a name or a torch dtype)."""
    dtype = engine.dtype if isinstance(engine.dtype, torch.dtype) else getattr(torch, str(engine.dtype))
    item = torch.empty((), dtype=dtype).element_size()
    return engine.model_config.kv_bytes_per_token(item) * engine.cache.page_size


class LiveView:
    """Builds ``GET /ui/api/live`` for one caller from the server's state."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        engine, cfg = state.engine, state.engine.config
        self.page_bytes = page_bytes(engine)
        self.host_budget = cfg.kv_host_memory
        self.disk_budget = cfg.kv_store_size if cfg.kv_store else None
        self.shared_url = cfg.kv_shared_store

    async def snapshot(self, tenant: str | None, after: int) -> dict[str, Any]:
        st = self.state
        stats = await st.refresh_stats()
        own_only = not st.tenants.sees_all(tenant)
        cache = describe(st.last_cache, tenant, own_only)  # as GET /v1/cache
        if own_only:  # a tenant key sees what its /v1/cache carries: nothing other tenants' traffic moves
            return {
                "object": "ui.live", "now": time.time(), "model": st.config.served_model_name,
                "tenant": tenant, "keys": st.tenants.enabled, "history": st.activity.per_tenant,
                "requests": st.activity.since(tenant, after), "cache": cache,
                "tiers": own_tiers(cache, self.page_bytes), "engine": None,
            }  # fmt: skip
        return {
            "object": "ui.live",
            "now": time.time(),
            "model": st.config.served_model_name,
            "tenant": tenant,
            "keys": st.tenants.enabled,
            "history": st.activity.per_tenant,
            "requests": st.activity.since(tenant, after),
            "cache": cache,
            "tiers": tiers(
                stats, st.last_cache, self.page_bytes, self.host_budget, self.disk_budget, self.shared_url
            ),
            "engine": {"running": stats.running, "waiting": stats.waiting, "in_flight": st.in_flight},
        }
