"""Everything one server instance owns: the async engine, template, metrics, diagnostics, admission."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import EngineStats
from kvreuse.runtime.server.activity import NoActivity, RecentRequests
from kvreuse.runtime.server.background import BackgroundTasks
from kvreuse.runtime.server.cache_info import CacheCollector, CacheSnapshot, cache_snapshot
from kvreuse.runtime.server.diagnostics import CacheDiagnostics
from kvreuse.runtime.server.errors import APIError, bad_request
from kvreuse.runtime.server.guard import LOOPBACK_HOSTS
from kvreuse.runtime.server.max_tokens import policy as max_tokens_policy
from kvreuse.runtime.server.metrics import ServerMetrics
from kvreuse.runtime.server.prep import PrepPool
from kvreuse.runtime.server.scripted import replies_from
from kvreuse.runtime.server.templates import TemplateInfo, resolve_template
from kvreuse.runtime.server.tenants import Tenants

T = TypeVar("T")


@dataclass
class ServerConfig:
    """Server-level options (engine options live in the engine)."""

    served_model_name: str
    chat_template: str | None = None
    max_waiting: int = 64
    retry_after_s: int = 1
    diagnostics_history: int = 64
    shutdown_timeout_s: float = 10.0
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS  # Host header values served ("*": any)
    cors_origins: tuple[str, ...] = ()  # origins a browser page may call us from (none: CORS closed)
    max_request_bytes: int = 8 << 20  # bodies above this are refused before they are read whole
    body_timeout_s: float = 30.0  # a body not received whole within this is a 408
    prep_threads: int = 4  # renders / tokenisations / grammar compiles running at once, off the event loop
    # of those, what one tenant may hold at once (keys on; without keys: all): one, since its Python work
    # holds the GIL that every engine step retakes at each torch op (benchmarks/serving/fairness.py)
    prep_share: int = 1
    prep_wait_s: float = 30.0  # a request waits this long for its tenant's prep share, then 429
    health_stall_s: float = 30.0  # /health says 503 "stalled" when one engine turn takes longer
    api_keys: dict[str, str] = field(default_factory=dict)  # key -> tenant; empty: no authentication
    tenant_max_requests: int = 32  # running + waiting per tenant before 429s
    public_system_prompt: str | None = None  # the system prompt all tenants may share (opt-in)
    keep_billing_header: bool = False  # Anthropic: keep Claude Code's per-request nonce system block
    model_aliases: tuple[str, ...] = ("claude-*",)  # Anthropic model names served by this model
    ui: bool = True  # the live page at /ui (--no-ui: off, and no request records kept)
    ui_history: int = 200  # finished requests the page keeps per tenant
    max_tokens_overflow: str = "clamp"  # max_tokens beyond the room left: clamp (llama.cpp's way) or refuse
    max_tokens_cap: int | None = None  # no request generates more (llama.cpp's server --n-predict)
    record: str | None = None  # a JSON-lines file every HTTP exchange is written to (benchmarks; recorder.py)
    script: str | None = None  # a JSON script of replies forced through the engine (benchmarks; scripted.py)


MODEL_NAME_SHOWN = 64  # characters of a client's model value echoed back in a 404


def text_chars(value: Any) -> int:
    """Characters of every string inside ``value`` (a parsed JSON body part), walked without recursion."""
    total, stack = 0, [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return total


class ServerState:
    """Per-app state; handlers reach it through ``request.app.state.kv``."""

    def __init__(self, aengine: AsyncEngine, config: ServerConfig) -> None:
        self.aengine = aengine
        self.engine = aengine.engine
        self.config = config
        self.tokenizer = self.engine.tokenizer
        self.template: TemplateInfo = resolve_template(
            self.tokenizer, config.chat_template, self.engine.model_config.model_type
        )
        self.diagnostics = CacheDiagnostics(
            self.tokenizer, self.engine.cache.page_size, config.diagnostics_history
        )
        self._tenant_diagnostics: dict[Any, CacheDiagnostics] = {None: self.diagnostics}
        self.activity = RecentRequests(config.ui_history) if config.ui else NoActivity()
        self.last_stats: EngineStats | None = None
        self.last_cache: CacheSnapshot | None = None
        self.metrics = ServerMetrics(lambda: self.last_stats)
        self.metrics.registry.register(CacheCollector(lambda: self.last_cache))
        self.capacity = self.engine.config.max_running + config.max_waiting
        self.tenants = Tenants(
            config.api_keys, config.tenant_max_requests, config.retry_after_s, config.public_system_prompt
        )
        self.max_token_chars = max(1, max(map(len, self.tokenizer.get_vocab()), default=1))
        self.in_flight = 0
        self.draining = False
        # the server's own files that can fail to be written (name -> why not, or None): /health reads them
        self.faults: dict[str, Callable[[], str | None]] = {}
        self.created = int(time.time())
        self.max_tokens = max_tokens_policy(config.max_tokens_overflow, config.max_tokens_cap)
        self.replies = replies_from(config.script)  # the model's own, or a benchmark's script
        self.background = BackgroundTasks()  # a turn's re-rendered prefill (core/rerender.py)
        self.prep = PrepPool(config.prep_threads, config.prep_share, config.prep_wait_s, config.retry_after_s)

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in (self.config.served_model_name, self.engine.model_name):
            shown = name if len(name) <= MODEL_NAME_SHOWN else f"{name[:MODEL_NAME_SHOWN]}..."
            raise APIError(
                404, f"model {shown!r} does not exist; this server serves {self.config.served_model_name!r}",
                type="not_found_error", param="model", code="model_not_found",
            )  # fmt: skip

    def check_messages(self, messages: Any) -> None:
        """Refuse before rendering what cannot fit: every message renders to at least one token, and
        no token is longer than the vocabulary's longest, so text longer than the context's worth of
        those cannot fit either (a 4 MB message took 34 s to be refused after tokenising)."""
        if not isinstance(messages, list):
            return
        limit = self.engine.max_model_len
        if len(messages) > limit:
            raise bad_request(
                f"{len(messages)} messages cannot fit the model's context length ({limit} tokens)",
                "messages", "context_length_exceeded",
            )  # fmt: skip
        chars = text_chars(messages)
        if chars > limit * self.max_token_chars:
            raise bad_request(
                f"{chars} characters of messages cannot fit the model's context length ({limit} tokens "
                f"of at most {self.max_token_chars} characters)", "messages", "context_length_exceeded",
            )  # fmt: skip

    def admit(self, slots: int = 1) -> None:
        """Reserve capacity for a request's lifetime, or refuse with 503 + Retry-After."""
        if self.draining:
            self.metrics.rejected.inc()
            raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
        if slots > self.capacity:  # waiting would not help: it can never be admitted
            raise bad_request(
                f"n = {slots} exceeds what this server ever runs at once ({self.capacity}: "
                "--max-running + --max-waiting)", "n",
            )  # fmt: skip
        if self.in_flight + slots > self.capacity:
            self.metrics.rejected.inc()
            raise APIError(
                503,
                f"too many requests in flight ({self.in_flight}, limit {self.capacity}); retry shortly",
                type="server_error", code="overloaded", headers={"Retry-After": str(self.config.retry_after_s)},
            )  # fmt: skip
        self.in_flight += slots

    def release(self, slots: int = 1) -> None:
        self.in_flight -= slots

    async def on_engine(self, fn: Callable[[Any], T], timeout: float = 30.0) -> T:
        """Run ``fn(engine)`` on the engine thread, between steps, without blocking the event loop
        (EngineDead, a 503, when the engine loop has stopped)."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.aengine.run_idle, fn, timeout), timeout + 1)
        except TimeoutError:  # a busy or stuck engine is the server's state, not a crash: 503, not 500
            raise APIError(
                503, f"the engine did not get to this within {timeout:g} s; retry shortly",
                type="server_error", code="engine_busy", headers={"Retry-After": str(self.config.retry_after_s)},
            ) from None  # fmt: skip

    def health(self) -> tuple[dict[str, Any], int]:
        """``/health``'s body and status from what can be read at once (no engine call): dead or
        stalled engine loop 503; a disk tier that takes no writes 200 ``degraded`` with the reason."""
        if self.aengine.error is not None:
            return {"status": "error", "error": str(self.aengine.error)}, 503
        stalled = self.aengine.stalled_for()
        if stalled > self.config.health_stall_s:
            return {"status": "stalled", "stalled_s": round(stalled, 1), "in_flight": self.in_flight}, 503
        body: dict[str, Any] = {"status": "draining" if self.draining else "ok", "in_flight": self.in_flight}
        store = self.engine.cache.tier_error()
        if store is not None:
            body["kv_store"] = f"serving from the pool: {store}"
            body["status"] = "degraded" if not self.draining else body["status"]
        for name, fault in self.faults.items():
            why = fault()
            if why is not None:
                body[name] = why
                body["status"] = "degraded" if not self.draining else body["status"]
        return body, 200

    def diagnostics_for(self, namespace: Any) -> CacheDiagnostics:
        """Each tenant's diagnosis compares only against its own history (never another tenant's text)."""
        if namespace not in self._tenant_diagnostics:
            self._tenant_diagnostics[namespace] = CacheDiagnostics(
                self.tokenizer, self.engine.cache.page_size, self.config.diagnostics_history
            )
        return self._tenant_diagnostics[namespace]

    def clear_diagnostics(self) -> None:
        for d in self._tenant_diagnostics.values():
            d.history.clear()

    async def refresh_stats(self) -> EngineStats:
        self.last_stats, self.last_cache = await self.on_engine(lambda e: (e.stats(), cache_snapshot(e)))
        return self.last_stats
