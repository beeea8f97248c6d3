"""``kvreuse serve``: load the engine, print a banner, serve until SIGTERM/SIGINT, drain, exit 0."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

import uvicorn

from kvreuse.runtime.engine.args import add_engine_args, engine_kwargs

log = logging.getLogger("kvreuse.server")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvreuse serve", description="OpenAI-compatible server with honest KV-cache figures."
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--served-model-name", default=None, help="model id clients send (default: the model's name)"
    )
    p.add_argument(
        "--chat-template", default=None, help="bundled name (chatml, qwen3, llama3) or a .jinja path"
    )
    p.add_argument(
        "--max-waiting", type=int, default=64, help="requests queued beyond --max-running before 503s"
    )
    p.add_argument(
        "--shutdown-timeout", type=float, default=10.0, help="seconds to finish running requests on SIGTERM"
    )
    p.add_argument(
        "--diagnostics-history", type=int, default=64, help="earlier requests kept for cache-miss diagnosis"
    )
    p.add_argument(
        "--allowed-hosts",
        default=None,
        help="comma-separated Host header names served (default: localhost, 127.0.0.1, ::1 and --host; "
        "'*' = any). Guards a loopback server against DNS rebinding from web pages",
    )
    p.add_argument(
        "--cors-allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let browser pages from ORIGIN (e.g. http://localhost:3000; repeatable) call the API; default: CORS closed",
    )
    p.add_argument(
        "--max-request-bytes",
        type=int,
        default=8 << 20,
        help="largest request body accepted, refused with 413 before it is read (default 8 MiB)",
    )
    p.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="a key clients must send (repeatable); each is a tenant",
    )
    p.add_argument(
        "--operator-key", action="append", default=None,
        help="a key for /metrics, /debug/kv, /docs and cache reset when API keys are on (repeatable; "
        "a key-file line naming the tenant '@operator' does the same)",
    )  # fmt: skip
    p.add_argument(
        "--body-timeout", type=float, default=30.0,
        help="seconds a client may take to send its request body before a 408 (default 30)",
    )  # fmt: skip
    p.add_argument(
        "--api-key-file", default=None, help="one 'key [tenant-name]' per line; tenants never share cache"
    )
    p.add_argument(
        "--tenant-max-requests",
        type=int,
        default=32,
        help="running + waiting requests per tenant before 429s",
    )
    p.add_argument(
        "--public-system-prompt",
        default=None,
        help="file with a system prompt whose cache all tenants share (opt-in; nothing else is shared)",
    )
    p.add_argument(
        "--keep-billing-header", action="store_true",
        help="Anthropic API: keep a system block starting 'x-anthropic-billing-header:' (Claude Code's "
        "per-request nonce) in the prompt; by default it is left out so the prefix cache keeps hitting",
    )  # fmt: skip
    p.add_argument(
        "--model-alias", action="append", default=None, metavar="PATTERN",
        help="Anthropic API: model names (globs) answered by the served model (default: claude-*)",
    )  # fmt: skip
    p.add_argument(
        "--max-tokens-overflow", choices=("clamp", "refuse"), default="clamp",
        help="max_tokens beyond the context the prompt leaves: clamp it to the room left (default, as "
        "llama.cpp; reported in usage.max_tokens_clamped) or refuse the request with a 400",
    )  # fmt: skip
    p.add_argument(
        "--max-tokens-cap", type=int, default=None, metavar="N",
        help="no request generates more than N tokens (llama.cpp's server --n-predict; reported in "
        "usage.max_tokens_clamped with by: cap); default: no cap",
    )  # fmt: skip
    p.add_argument(
        "--script", default=None, metavar="JSON",
        help="benchmarks: force each reply from this script through the engine (runtime/server/scripted.py); "
        "every figure of such a run is 'scripted'",
    )  # fmt: skip
    p.add_argument(
        "--record", default=None, metavar="JSONL",
        help="benchmarks: append every HTTP exchange (request body, final usage and cache diagnosis) to this file",
    )  # fmt: skip
    p.add_argument("--no-ui", action="store_true", help="no live page at /ui (and no request records kept)")
    p.add_argument(
        "--ui-history", type=int, default=200, help="finished requests the /ui page keeps per tenant"
    )
    p.add_argument(
        "--grpc-port", type=int, default=None,
        help="also serve SMG's gRPC engine service (vllm.grpc.engine) on this port, with KV cache events "
        "for the gateway's event-driven routing (`kvreuse cluster --routing events`)",
    )  # fmt: skip
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_engine_args(p)
    return p


class _DrainingServer(uvicorn.Server):
    """Stops admission (new requests get 503) as soon as a shutdown signal arrives, and after
    ``cut_after`` seconds ends what still runs through ``cut`` (so streams end with an error event
    and ``[DONE]`` rather than a dropped connection when uvicorn's own timeout cancels them)."""

    def __init__(self, config: uvicorn.Config, on_signal, cut, cut_after: float) -> None:
        super().__init__(config)
        self._on_signal, self._cut, self._cut_after = on_signal, cut, cut_after
        self._timer: threading.Timer | None = None

    def handle_exit(self, sig: int, frame) -> None:
        self._on_signal()
        if self._timer is None:
            self._timer = threading.Timer(self._cut_after, self._cut)
            self._timer.daemon = True
            self._timer.start()
        super().handle_exit(sig, frame)


def banner(engine, pool_tokens: int, url: str, template: str, name: str, ui: bool = True) -> str:
    cfg = engine.config
    return "\n".join(
        (
            f"kvreuse serve: {name} ({engine.model_dir})",
            f"  dtype {str(engine.dtype).removeprefix('torch.')}, device {engine.device}, context {engine.max_model_len} tokens",
            f"  KV pool {pool_tokens} tokens ({engine.stats().total_pages} pages of {engine.cache.page_size}), "
            f"prefix cache {cfg.prefix_cache}, max running {cfg.max_running}",
            f"  chat template: {template}",
            f"  listening on {url}  (OpenAI base_url {url}/v1)",
            f"  live page: {url}/ui" if ui else "  live page: off (--no-ui)",
        )
    )


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.max_waiting < 0:
        raise ValueError("--max-waiting must be >= 0")
    if args.max_tokens_cap is not None and args.max_tokens_cap < 1:
        raise ValueError("--max-tokens-cap must be at least 1")
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from kvreuse.runtime.engine.async_engine import AsyncEngine
    from kvreuse.runtime.engine.engine import Engine
    from kvreuse.runtime.server.app import create_app
    from kvreuse.runtime.server.guard import LOOPBACK_HOSTS
    from kvreuse.runtime.server.state import ServerConfig
    from kvreuse.runtime.server.tenants import load_keys

    api_keys = load_keys(args.api_key, args.api_key_file, args.operator_key)
    if not api_keys and args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning(
            "binding %s without --api-key: anyone who can reach it can use it and time its cache", args.host
        )
    engine = Engine(args.model, **engine_kwargs(args))
    died: list[BaseException] = []
    server: _DrainingServer | None = None

    def on_death(e: BaseException) -> None:  # engine thread: every stream has its error already
        died.append(e)
        if server is not None:
            server.should_exit = True

    aengine = AsyncEngine(engine, on_death=on_death)
    name = args.served_model_name or engine.model_name
    hosts = (
        tuple(h for h in args.allowed_hosts.split(",") if h.strip())
        if args.allowed_hosts is not None
        else (*LOOPBACK_HOSTS, args.host)
    )
    config = ServerConfig(
        served_model_name=name,
        chat_template=args.chat_template,
        max_waiting=args.max_waiting,
        diagnostics_history=args.diagnostics_history,
        shutdown_timeout_s=args.shutdown_timeout,
        allowed_hosts=hosts,
        cors_origins=tuple(args.cors_allow_origin),
        max_request_bytes=args.max_request_bytes,
        body_timeout_s=args.body_timeout,
        api_keys=api_keys,
        tenant_max_requests=args.tenant_max_requests,
        public_system_prompt=None
        if args.public_system_prompt is None
        else Path(args.public_system_prompt).read_text(),
        keep_billing_header=args.keep_billing_header,
        model_aliases=tuple(args.model_alias) if args.model_alias is not None else ("claude-*",),
        ui=not args.no_ui,
        ui_history=args.ui_history,
        max_tokens_overflow=args.max_tokens_overflow,
        max_tokens_cap=args.max_tokens_cap,
        script=args.script,
        record=args.record,
    )
    engine.admission.grammars.warm()  # before listening: built on the first schema, it would stall every tenant
    services = []
    if args.grpc_port is not None:
        from kvreuse.runtime.server.grpc.serve import grpc_worker

        services.append(lambda st: grpc_worker(st, args.host, args.grpc_port))
    app = create_app(aengine, config, on_shutdown=lambda: aengine.shutdown(timeout=5.0), services=services)
    state = app.state.kv
    url = f"http://{args.host}:{args.port}"
    print(
        banner(engine, engine.admission.kv_capacity_tokens, url, state.template.name, name, config.ui),
        file=sys.stderr,
        flush=True,
    )
    uv_config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        # uvicorn's own deadline comes after our cut, which ends streams cleanly first
        timeout_graceful_shutdown=int(max(1, args.shutdown_timeout)) + 3,
        access_log=False,
    )
    cut = lambda: aengine.shutdown(timeout=2.0, reason="the server shut down (--shutdown-timeout)")  # noqa: E731
    server = _DrainingServer(uv_config, lambda: setattr(state, "draining", True), cut, args.shutdown_timeout)
    if died:  # the engine died while the server was being set up
        server.should_exit = True
    # uvicorn re-raises the captured signal after its graceful shutdown, so the handlers in place
    # then decide the exit status: ours ignore it, and we return 0 after a clean drain.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run()
    if died:  # non-zero, so a supervisor restarts us
        print(f"kvreuse serve: error: the engine stopped: {died[0]}", file=sys.stderr)
        return 3
    if not server.started:
        print(f"kvreuse serve: error: could not listen on {url}", file=sys.stderr)
        return 2
    return 0
