"""``kvreuse cluster``: N replicas behind the SMG gateway, sharing one Valkey KV tier, on one host.

::

    kvreuse cluster --replicas 3 --port 8000 -- --model HuggingFaceTB/SmolLM2-135M-Instruct
        valkey  127.0.0.1:P0   (--store-memory, LRU)         the shared tier every replica writes through to
        replica 127.0.0.1:P1.. kvreuse serve <args after --> --kv-shared-store valkey://127.0.0.1:P0
        gateway 127.0.0.1:8000 smg launch --worker-urls ... --policy cache_aware

Clients talk to the gateway (OpenAI API); it routes each request to the replica whose cache most
likely holds its prefix (SMG's approximate radix tree per worker, balanced by the load each replica
reports at ``/v1/loads``).  A replica that exits is started again on its port; meanwhile the gateway
sends its sessions elsewhere and they read their prefixes from the shared tier.  Ctrl-C / SIGTERM
stops everything.  Across hosts the same parts run one per host: see docs/scaling.md.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from runtime.cli.services import (
    Service,
    ServiceError,
    launch_replica,
    scratch_dir,
    start_gateway,
    start_valkey,
    wait_replica,
)

POLICIES = ["cache_aware", "round_robin", "power_of_two", "least_load", "prefix_hash", "consistent_hashing", "random"]


class Cluster:
    """The processes of one cluster; ``with Cluster(...) as c`` starts and stops them."""

    def __init__(
        self,
        replicas: int,
        serve_args: list[str],
        policy: str = "cache_aware",
        shared_store: str = "start",
        store_memory: str = "4gb",
        port: int | None = None,
        workdir: Path | None = None,
        gateway_args: list[str] | None = None,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {replicas}")
        self.n, self.serve_args, self.policy, self.port = replicas, list(serve_args), policy, port
        self.shared_store, self.store_memory, self.gateway_args = shared_store, store_memory, gateway_args
        self.workdir = workdir or scratch_dir()
        self.store: Service | None = None
        self.store_url: str | None = None
        self.replicas: list[Service] = []
        self.urls: list[str] = []
        self.gateway: Service | None = None
        self.url = ""

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        if self.shared_store == "start":
            self.store, self.store_url = start_valkey(self.workdir, self.store_memory)
        elif self.shared_store != "none":
            self.store_url = self.shared_store
        for i in range(self.n):
            svc, url = launch_replica(self.workdir, i, self._replica_args())
            self.replicas.append(svc)
            self.urls.append(url)
        for svc, url in zip(self.replicas, self.urls):
            wait_replica(svc, url)
        self.gateway, self.url = start_gateway(self.workdir, self.urls, self.policy, self.port, self.gateway_args)

    def _replica_args(self) -> list[str]:
        return self.serve_args + (["--kv-shared-store", self.store_url] if self.store_url else [])

    def kill_replica(self, i: int) -> None:
        """SIGKILL replica ``i`` (a crash: nothing flushed, in-flight requests cut)."""
        self.replicas[i].kill()

    def restart_replica(self, i: int) -> None:
        """Start replica ``i`` again on its port (the gateway's health checks take it back)."""
        port = int(self.urls[i].rsplit(":", 1)[1])
        self.replicas[i], _ = launch_replica(self.workdir, i, self._replica_args(), port)
        wait_replica(self.replicas[i], self.urls[i])

    def stop(self) -> None:
        for svc in [self.gateway, *self.replicas, self.store]:
            if svc is not None:
                svc.stop()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvreuse cluster",
        description="N kvreuse replicas behind the SMG gateway, sharing a Valkey KV tier; arguments after "
        "'--' go to every replica's `kvreuse serve`.",
    )
    p.add_argument("--replicas", type=int, default=2, help="replicas to start (default 2)")
    p.add_argument("--port", type=int, default=8000, help="the gateway's port on 127.0.0.1 (default 8000)")
    p.add_argument("--policy", choices=POLICIES, default="cache_aware", help="the gateway's routing policy")
    p.add_argument(
        "--shared-store",
        default="start",
        help="'start' (default): a Valkey server on a free port; a valkey:// URL: that server; 'none': no shared tier",
    )
    p.add_argument("--store-memory", default="4gb", help="the started Valkey server's maxmemory (LRU beyond it)")
    p.add_argument("--workdir", type=Path, default=None, help="logs of every process (default: a temp directory)")
    return p


def main(argv: list[str]) -> int:
    ours, serve_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = build_parser().parse_args(ours)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster = Cluster(args.replicas, serve_args, args.policy, args.shared_store, args.store_memory,
                      args.port, args.workdir)  # fmt: skip
    try:
        with cluster:
            print(f"kvreuse cluster: gateway {cluster.url} ({args.policy}) over {cluster.n} replicas: "
                  f"{' '.join(cluster.urls)}; shared KV store {cluster.store_url or 'none'}; logs in {cluster.workdir}",
                  flush=True)  # fmt: skip
            while not stop.wait(1.0):
                for i, svc in enumerate(cluster.replicas):
                    if not svc.alive:
                        print(f"kvreuse cluster: replica {i} exited ({svc.proc.returncode}); restarting", flush=True)
                        cluster.restart_replica(i)
    except (ServiceError, ValueError) as e:
        print(f"kvreuse cluster: error: {e}", file=sys.stderr)
        return 2
    return 0
