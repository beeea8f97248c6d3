"""Ray Serve's prefix-aware router in front of kvreuse replicas: the alternative gateway, measured.

``python -m kvreuse.benchmarks.cluster.ray_gateway --port P --router prefix|round_robin URL...`` serves
``/v1/chat/completions`` on ``P`` through Ray Serve: one Ray replica per kvreuse server URL (replica
rank ``i`` forwards to ``URL[i]``, streaming the server's SSE bytes back unchanged), routed by
Ray Serve LLM's ``PrefixCacheAffinityRouter`` (a text prefix tree per replica, as SMG's
``cache_aware``; ``--imbalanced-threshold`` is its load override) or by Ray Serve's
``RoundRobinRouter``.  ``benchmarks/cluster/replicas.py`` runs it beside SMG on the same replicas
(``ray_prefix_3`` / ``ray_round_robin_3``); needs ``pip install -e '.[ray]'``.

It lives with the benchmarks, not in ``runtime/cluster``: kvreuse's gateway is SMG, and this is what
that choice was measured against.  Each Ray replica is a thin proxy, so the replicas, their pools
and the shared tier are exactly those SMG fronts; only the router differs.
"""

# no ``from __future__ import annotations``: Ray pickles the endpoints by value, and FastAPI must see
# ``Request`` itself, not a name it can no longer resolve
import argparse
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

ROUTERS = {
    # the class ``ray.serve.llm.request_router`` re-exports; that module imports vLLM or SGLang first
    "prefix": "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router.PrefixCacheAffinityRouter",
    "round_robin": "ray.serve.experimental.round_robin_router.RoundRobinRouter",
}


@dataclass
class Chat:
    """What the ingress hands a replica: the router reads ``messages`` (its prefix-matching text)."""

    messages: list[dict]
    body: dict = field(default_factory=dict)


def build(urls: list[str], router: str, imbalanced_threshold: float):
    """The Ray Serve application: an ingress and ``len(urls)`` forwarding replicas."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    kwargs = {"imbalanced_threshold": imbalanced_threshold} if router == "prefix" else {}

    @serve.deployment(
        num_replicas=len(urls),
        max_ongoing_requests=256,
        ray_actor_options={"num_cpus": 0},
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTERS[router], request_router_kwargs=kwargs
        ),
    )
    class Forward:
        def __init__(self, urls: list[str]) -> None:
            self.url = urls[serve.get_replica_context().rank.rank]
            self.client = httpx.AsyncClient(timeout=600)

        async def chat(self, req: Chat):
            # the status is already sent (200): a replica's error reaches the client as its JSON body,
            # which the benchmark's client counts as an error (no usage chunk)
            async with self.client.stream("POST", self.url + "/v1/chat/completions", json=req.body) as r:
                async for chunk in r.aiter_bytes():
                    yield chunk

    app = FastAPI()

    @serve.deployment(num_replicas=1, max_ongoing_requests=1024, ray_actor_options={"num_cpus": 0})
    @serve.ingress(app)
    class Ingress:
        def __init__(self, replicas) -> None:
            self.replicas = replicas.options(stream=True)

        @app.post("/v1/chat/completions")
        async def chat(self, request: Request):
            body = await request.json()
            if not body.get("stream"):
                return JSONResponse({"error": {"message": "this benchmark gateway streams only"}}, 400)
            gen = self.replicas.chat.remote(Chat(body.get("messages", []), body))
            return StreamingResponse(gen, media_type="text/event-stream")

        @app.get("/health")
        async def health(self):
            return {"ok": True}

    return Ingress.bind(Forward.bind(urls))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m kvreuse.benchmarks.cluster.ray_gateway", description=__doc__.splitlines()[0]
    )
    p.add_argument("urls", nargs="+", help="kvreuse servers, one Ray replica each")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--router", choices=sorted(ROUTERS), default="prefix")
    p.add_argument("--imbalanced-threshold", type=float, default=float("inf"),
                   help="prefix router: queue-length gap above which it balances load instead (Ray's default: never)")  # fmt: skip
    args = p.parse_args(argv)
    try:
        import ray
        from ray import serve
    except ImportError:
        print(
            "kvreuse.benchmarks.cluster.ray_gateway: Ray Serve is not installed: pip install -e '.[ray]'",
            file=sys.stderr,
        )
        return 2
    # SIGTERM (Service.stop) unwinds through the finally below, so Ray's own processes go too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    root = str(Path(__file__).resolve().parents[2])
    ray.init(
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": root}},
        log_to_driver=False,
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        serve.run(build(args.urls, args.router, args.imbalanced_threshold), route_prefix="/", blocking=False)
        print(f"ray gateway ({args.router}) on {args.port} -> {args.urls}", flush=True)
        signal.pause()
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


def start_ray_gateway(workdir: Path, worker_urls: list[str], router: str, imbalanced_threshold: float):
    """The gateway as a child process, ready when it answers ``/health``: ``(service, url)`` like
    ``kvreuse.runtime.cluster.services.start_gateway``."""
    from kvreuse.runtime.cluster.services import Service, free_port

    class RayGateway(Service):
        def stop(self, timeout_s: float = 60.0) -> None:
            """Ray shuts down on SIGTERM; its agents outlive the driver, so the process group goes too."""
            super().stop(timeout_s)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    port = free_port()
    argv = [sys.executable, "-m", "kvreuse.benchmarks.cluster.ray_gateway", "--port", str(port), "--router", router,
            "--imbalanced-threshold", str(imbalanced_threshold), *worker_urls]  # fmt: skip
    svc = RayGateway(f"ray gateway ({router})", argv, workdir / f"ray_{router}.log")
    url = f"http://127.0.0.1:{port}"
    svc.wait_ready(lambda: httpx.get(url + "/health", timeout=2.0).status_code == 200, 180.0)
    return svc, url


if __name__ == "__main__":
    raise SystemExit(main())
