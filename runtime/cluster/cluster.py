"""A cluster as an object: a Valkey server, N replicas, the SMG gateway (``Cluster``), each on the
host its :class:`Placement` names (all on this host's loopback unless told otherwise).

Used by ``kvreuse cluster`` (``runtime/cli/cluster.py``), the gateway tests and the replicas benchmark.
"""

from __future__ import annotations

import argparse
import json
import secrets
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from kvreuse.runtime.cluster.services import (
    LOOPBACK,
    NO_AUTH,
    GatewayAuth,
    Host,
    Service,
    await_healthy,
    free_port,
    launch_replica,
    register_worker,
    scratch_dir,
    start_gateway,
    start_valkey,
    wait_replica,
)
from kvreuse.runtime.cluster.supervisor import Supervisor, Watch
from kvreuse.runtime.server.tenants import OPERATOR, load_keys

ROUTINGS = ("approx", "events")
# SMG's manual policy pins a session key (the X-SMG-Routing-Key header) to a worker; a new key goes to
# the worker with the fewest requests (its default, random, left replicas unevenly loaded)
MANUAL_POLICY_ARGS = ["--assignment-mode", "min_load"]
# The settings the routing benchmark measured (benchmarks/cluster/replicas.py, docs/scaling.md) and the failover
# tests use: follow a cached prefix only when it is at least half the prompt, spill to the least-loaded
# replica at a gap of 2 in-flight requests (and 1.5x the mean), and a health check every second that
# marks a worker down at the first failure and back at the second success.  At SMG's defaults (0.3,
# 64, a check a minute) cache-aware routing left a replica idle and a restarted one got no new session.
GATEWAY_DEFAULTS = ["--cache-threshold", "0.5", "--balance-abs-threshold", "2", "--balance-rel-threshold", "1.5",
                    "--health-check-interval-secs", "1", "--health-failure-threshold", "1"]  # fmt: skip
SECRET_FLAG = "--kv-shared-secret-file"  # kvreuse serve's: the key that signs shared-store entries


def with_defaults(defaults: list[str], given: list[str]) -> list[str]:
    """``given`` (flag value pairs and bare flags) plus each default flag ``given`` does not set."""
    flags = {a.split("=", 1)[0] for a in given if a.startswith("--")}
    out, i = [], 0
    while i < len(defaults):
        has_value = i + 1 < len(defaults) and not defaults[i + 1].startswith("--")
        if defaults[i] not in flags:
            out += defaults[i : i + 1 + has_value]
        i += 1 + has_value
    return out + list(given)


def serve_has(flag: str) -> bool:
    """Whether this kvreuse's ``serve`` takes ``flag`` (a flag another change may add)."""
    from kvreuse.runtime.server.cli import build_parser

    return flag in build_parser()._option_string_actions


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
    ``worker_urls`` what the gateway was given.  ``gateway_args`` are added to
    :data:`GATEWAY_DEFAULTS` (a flag given there replaces the default's).

    A Valkey server it starts demands a password made up here (``store_url`` carries it, for the
    replicas; ``public_store_url`` does not), and the replicas are given a secret to sign the entries
    with (``workdir/kv-shared-secret``) when their ``kvreuse serve`` takes :data:`SECRET_FLAG`.
    Every part is restarted on its own address by :meth:`supervise` (``runtime/cluster/supervisor.py``).
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
        self.shared_store, self.store_memory = shared_store, store_memory
        self.gateway_args = with_defaults(GATEWAY_DEFAULTS, list(gateway_args or []))
        self.workdir = workdir or scratch_dir()
        self.store: Service | None = None
        self.store_url: str | None = None
        self.store_password = secrets.token_urlsafe(24) if shared_store == "start" else None
        self.secret_file: Path | None = None  # set by start() when the replicas take it
        self.replicas: list[Service] = []
        self.urls: list[str] = []
        self.worker_urls: list[str] = []
        self.gateway: Service | None = None
        self.url = ""
        self.supervisor: Supervisor | None = None
        self._state_lock = threading.Lock()

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def public_store_url(self) -> str | None:
        """The store's URL without its password (for logs and ``cluster.json``)."""
        if self.store_url is None:
            return None
        from kvreuse.runtime.cache.store.shared import public_url

        return public_url(self.store_url)

    def start(self) -> None:
        if self.shared_store == "start":
            self.store, self.store_url = start_valkey(
                self.workdir, self.store_memory, host=self.placement.store, password=self.store_password
            )
            if serve_has(SECRET_FLAG):
                self.secret_file = self.workdir / "kv-shared-secret"
                self.secret_file.touch(mode=0o600)
                self.secret_file.write_text(secrets.token_hex(32) + "\n")
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
        self._start_gateway(self.port)
        self.port = int(self.url.rsplit(":", 1)[1])
        self.write_state()

    def _start_gateway(self, port: int | None, workers_ready: int | None = None) -> None:
        self.gateway, self.url = start_gateway(
            self.workdir,
            self.worker_urls,
            self.policy,
            port,
            self._gateway_args(),
            self.placement.gateway,
            self.auth,
            workers_ready=workers_ready,
        )

    def _gateway_args(self) -> list[str]:
        args = list(self.gateway_args)
        if self.routing == "events" and "--page-size" in self.serve_args and "--block-size" not in args:
            # the index's block is a replica's page (SMG also learns it from the first event)
            args += ["--block-size", self.serve_args[self.serve_args.index("--page-size") + 1]]
        return args

    def _replica_args(self) -> list[str]:
        store = ["--kv-shared-store", self.store_url] if self.store_url else []
        secret = [SECRET_FLAG, str(self.secret_file)] if self.secret_file else []
        return self.serve_args + self._auth_args + store + secret

    def kill_replica(self, i: int) -> None:
        """SIGKILL replica ``i`` (a crash: nothing flushed, in-flight requests cut)."""
        self.replicas[i].kill()

    def restart_replica(self, i: int) -> None:
        """Start replica ``i`` again on its port and wait until it is ready, then until the gateway lists
        it healthy (SMG takes it back at its second good health check; one that dropped it is told
        again), so that new sessions reach it when this returns."""
        self.replicas[i].kill()  # a half-started one, if any (idempotent)
        port = int(self.urls[i].rsplit(":", 1)[1])
        grpc_port = int(self.worker_urls[i].rsplit(":", 1)[1]) if self.routing == "events" else None
        self.replicas[i], _ = launch_replica(
            self.workdir, i, self._replica_args(), port, grpc_port, self.placement.replica(i)
        )
        self.write_state()
        wait_replica(self.replicas[i], self.urls[i])
        if self.gateway is not None and self.gateway.alive:
            try:
                register_worker(self.url, self.worker_urls[i], self.auth)
            except httpx.HTTPError:
                return  # the gateway is going down: its restart is given every replica
            # back in rotation, so new sessions reach it (or the gateway is gone: it takes it back later)
            await_healthy(self.url, self.worker_urls[i], self.auth)

    def restart_store(self) -> None:
        """Start the Valkey server again on its port, with its password (empty: no persistence; the
        replicas find it back at their next background check and write their new pages to it)."""
        if self.store is None:
            return
        self.store.kill()
        port = int(self.store_url.rsplit(":", 1)[1])
        self.store, _ = start_valkey(
            self.workdir, self.store_memory, port, self.placement.store, self.store_password
        )

    def restart_gateway(self) -> None:
        """Start the gateway again on its port, ready once one replica is listed (a replica down now
        is registered when its own restart is done)."""
        if self.gateway is not None:
            self.gateway.kill()
        self._start_gateway(self.port, workers_ready=1)

    def supervise(self, report) -> Supervisor:
        """Start restarting every part that exits (``report`` gets one line per event); the
        supervisor is stopped by :meth:`stop`."""
        watches = [Watch(f"replica {i}", lambda i=i: self.replicas[i].alive, lambda i=i: self.restart_replica(i))
                   for i in range(self.n)]  # fmt: skip
        if self.store is not None:
            watches.insert(0, Watch("valkey", lambda: self.store.alive, self.restart_store))
        if self.gateway is not None:
            watches.append(Watch("gateway", lambda: self.gateway.alive, self.restart_gateway))
        self.supervisor = Supervisor(watches, report, on_change=self.write_state)
        self.supervisor.start()
        return self.supervisor

    def state(self) -> dict:
        """Each part's address, process id and restarts: what ``workdir/cluster.json`` holds."""
        parts = {w.name: asdict(w.state) for w in self.supervisor.watches} if self.supervisor else {}

        def part(name: str, svc: Service | None, url: str | None) -> dict:
            alive = svc is not None and svc.alive
            return {"url": url, "pid": svc.pid if svc else None, "alive": alive, **parts.get(name, {})}

        return {
            "gateway": part("gateway", self.gateway, self.url),
            "gateway_metrics": self.gateway.metrics_url if self.gateway else None,
            "store": part("valkey", self.store, self.public_store_url),
            "replicas": [
                part(f"replica {i}", s, u) for i, (s, u) in enumerate(zip(self.replicas, self.urls))
            ],
            "operator_key_file": str(self.workdir / "operator-key") if self.auth.operator_key else None,
        }

    def write_state(self) -> None:
        """``workdir/cluster.json`` (and the gateway's operator key, 0600, for ``kvreuse cluster
        reset``), replaced whole so a reader never sees half of it."""
        with self._state_lock:
            if self.auth.operator_key and not (key := self.workdir / "operator-key").exists():
                key.touch(mode=0o600)
                key.write_text(self.auth.operator_key + "\n")
            tmp = self.workdir / "cluster.json.tmp"
            tmp.write_text(json.dumps(self.state(), indent=1))
            tmp.replace(self.workdir / "cluster.json")

    def stop(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()
        try:
            for svc in self._services():
                svc.stop()
        finally:  # a signal or an error while one stops must not leave the others running
            for svc in self._services():
                svc.kill()
            if self.supervisor is not None:  # a restart that was starting a process when told to stop
                self.supervisor.join()
                for svc in self._services():
                    svc.kill()

    def _services(self) -> list[Service]:
        return [svc for svc in [self.gateway, *self.replicas, self.store] if svc is not None]
