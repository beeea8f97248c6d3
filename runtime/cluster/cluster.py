"""A cluster as an object: a Valkey server, N replicas, the SMG gateway (``Cluster``), each on the
host its :class:`Placement` names (all on this host's loopback unless told otherwise).

Used by ``kvreuse cluster`` (``runtime/cli/cluster.py``), the gateway tests and the replicas benchmark.
"""

from __future__ import annotations

import argparse
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from kvreuse.runtime.cluster.services import (
    LOOPBACK,
    NO_AUTH,
    GatewayAuth,
    Host,
    Service,
    free_port,
    launch_replica,
    register_worker,
    scratch_dir,
    start_gateway,
    start_valkey,
    wait_replica,
)
from kvreuse.runtime.server.tenants import OPERATOR, load_keys

ROUTINGS = ("approx", "events")
# SMG's manual policy pins a session key (the X-SMG-Routing-Key header) to a worker; a new key goes to
# the worker with the fewest requests (its default, random, left replicas unevenly loaded)
MANUAL_POLICY_ARGS = ["--assignment-mode", "min_load"]


@dataclass(frozen=True)
class Placement:
    """Which host each part runs on: the store, replica ``i`` (``replicas[i % len(replicas)]``), the
    gateway.  The default puts everything on this host's loopback (``kvreuse cluster``)."""

    store: Host = LOOPBACK
    replicas: tuple[Host, ...] = field(default=(LOOPBACK,))
    gateway: Host = LOOPBACK

    def replica(self, i: int) -> Host:
        return self.replicas[i % len(self.replicas)]


def gateway_auth(serve_args: list[str]) -> tuple[GatewayAuth, list[str]]:
    """The gateway's keys for replicas started with ``serve_args``, and what to add to those.

    No API keys: ``NO_AUTH``.  With keys, the gateway needs an operator key for its own calls (it
    polls ``/v1/loads``, an operator route) and must accept every tenant's key; without an operator
    key among them, one is made up for this cluster and given to the replicas (``--operator-key``).
    """
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--api-key", action="append")
    p.add_argument("--operator-key", action="append")
    p.add_argument("--api-key-file")
    known, _ = p.parse_known_args(serve_args)
    try:
        keys = load_keys(known.api_key, known.api_key_file, known.operator_key)
    except OSError as e:
        raise ValueError(f"--api-key-file: {e.strerror}: {known.api_key_file}") from None
    if not keys:
        return NO_AUTH, []
    operator = next((k for k, tenant in keys.items() if tenant == OPERATOR), None)
    extra = [] if operator else ["--operator-key", operator := secrets.token_urlsafe(24)]
    tenants = tuple((tenant, key) for key, tenant in keys.items() if key != operator)
    return GatewayAuth(operator, tenants), extra


class Cluster:
    """The processes of one cluster; ``with Cluster(...) as c`` starts and stops them.

    ``routing``: ``approx``, the gateway reaches replicas over HTTP and routes by its own approximate
    tree of the text it sent; ``events``, each replica also serves SMG's gRPC engine service
    (``--grpc-port``), the gateway reaches it there (``grpc://``) and routes by an index built from
    the KV cache events each replica streams (``runtime/server/grpc/``): what is cached, exactly.
    ``urls`` are the replicas' HTTP addresses either way (health, metrics, the API directly);
    ``worker_urls`` what the gateway was given.
    """

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
        routing: str = "approx",
        placement: Placement = Placement(),
    ) -> None:
        if replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {replicas}")
        if routing not in ROUTINGS:
            raise ValueError(f"--routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
        self.auth, self._auth_args = gateway_auth(list(serve_args))
        if routing == "events" and self.auth != NO_AUTH:
            # SMG sends no client credentials over gRPC: every request would be refused (UNAUTHENTICATED)
            raise ValueError(
                "--routing events cannot serve API keys: SMG does not pass a client's key to gRPC workers"
            )
        self.routing, self.placement = routing, placement
        self.n, self.serve_args, self.policy, self.port = replicas, list(serve_args), policy, port
        self.shared_store, self.store_memory, self.gateway_args = shared_store, store_memory, gateway_args
        self.workdir = workdir or scratch_dir()
        self.store: Service | None = None
        self.store_url: str | None = None
        self.replicas: list[Service] = []
        self.urls: list[str] = []
        self.worker_urls: list[str] = []
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
            self.store, self.store_url = start_valkey(
                self.workdir, self.store_memory, host=self.placement.store
            )
        elif self.shared_store != "none":
            self.store_url = self.shared_store
        for i in range(self.n):
            grpc_port = free_port() if self.routing == "events" else None
            host = self.placement.replica(i)
            svc, url = launch_replica(self.workdir, i, self._replica_args(), grpc_port=grpc_port, host=host)
            self.replicas.append(svc)
            self.urls.append(url)
            self.worker_urls.append(host.url("grpc", grpc_port) if grpc_port else url)
        for svc, url in zip(self.replicas, self.urls):
            wait_replica(svc, url)
        self.gateway, self.url = start_gateway(
            self.workdir,
            self.worker_urls,
            self.policy,
            self.port,
            self._gateway_args(),
            self.placement.gateway,
            self.auth,
        )

    def _gateway_args(self) -> list[str]:
        args = list(self.gateway_args or [])
        if self.routing == "events" and "--page-size" in self.serve_args and "--block-size" not in args:
            # the index's block is a replica's page (SMG also learns it from the first event)
            args += ["--block-size", self.serve_args[self.serve_args.index("--page-size") + 1]]
        return args

    def _replica_args(self) -> list[str]:
        store = ["--kv-shared-store", self.store_url] if self.store_url else []
        return self.serve_args + self._auth_args + store

    def kill_replica(self, i: int) -> None:
        """SIGKILL replica ``i`` (a crash: nothing flushed, in-flight requests cut)."""
        self.replicas[i].kill()

    def restart_replica(self, i: int) -> None:
        """Start replica ``i`` again on its port (the gateway's health checks take it back)."""
        port = int(self.urls[i].rsplit(":", 1)[1])
        grpc_port = int(self.worker_urls[i].rsplit(":", 1)[1]) if self.routing == "events" else None
        self.replicas[i], _ = launch_replica(
            self.workdir, i, self._replica_args(), port, grpc_port, self.placement.replica(i)
        )
        wait_replica(self.replicas[i], self.urls[i])
        if self.gateway is not None:
            register_worker(self.url, self.worker_urls[i], self.auth)

    def stop(self) -> None:
        services = [svc for svc in [self.gateway, *self.replicas, self.store] if svc is not None]
        try:
            for svc in services:
                svc.stop()
        finally:  # a signal or an error while one stops must not leave the others running
            for svc in services:
                svc.kill()
