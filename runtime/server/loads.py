"""``GET /v1/loads``: a replica's load in the shape SGLang-family gateways poll (SMG's load monitor).

SMG asks workers it does not recognise as vLLM or SGLang for ``/v1/loads`` and reads one
``SchedulerLoadSnapshot`` per data-parallel rank: running and waiting requests, and the share of the
KV pool in use (``token_usage``), which its cache-aware policy weighs against prefix affinity.
A kvreuse replica is one rank.  Read from the engine's counters without waiting for a step.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from kvreuse.runtime.engine.engine import Engine


def worker_load(engine: Engine) -> dict[str, Any]:
    """The replica's load (running, waiting, pool pages in use) as a one-rank ``WorkerLoadResponse``."""
    running, waiting, used, total = engine.load()
    ps = engine.cache.page_size
    rank = {
        "dp_rank": 0,
        "num_running_reqs": running,
        "num_waiting_reqs": waiting,
        "num_total_reqs": running + waiting,
        "num_used_tokens": used * ps,
        "max_total_num_tokens": total * ps,
        "token_usage": round(used / total, 6) if total else 0.0,
        "max_running_requests": engine.config.max_running,
    }
    return {"timestamp": datetime.now(timezone.utc).isoformat(), "dp_rank_count": 1, "loads": [rank]}
