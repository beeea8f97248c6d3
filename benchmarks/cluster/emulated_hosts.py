"""Hosts of their own on one machine: a Linux network namespace each, joined by a bridge.

A cluster spread over these is what ``docs/scaling.md``'s across-hosts commands run on: each host
has its own network stack and address, so a replica binds ``0.0.0.0`` and is reached at its host's
address, the gateway and the store are reached over the bridge (a link that can be rate-limited,
``rate``), and nothing crosses a loopback interface.  The process that builds them (the test, the
benchmark's client) stays in this machine's own namespace, which gets one address on the bridge.
The file system and the CPUs are still shared: these are separate networks, not separate machines.

Needs root and iproute2 (``ip``, ``tc``); :func:`unavailable` says why not, in one line.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvreuse.runtime.cluster.services import Host


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def unavailable() -> str | None:
    """Why namespaces cannot be made here (``None``: they can)."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "no iproute2 (apt-get install iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"kvp{uuid.uuid4().hex[:8]}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as e:
        return f"cannot make a network namespace: {e.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


class EmulatedHosts:
    """``with EmulatedHosts(["store", "r0", "gw"]) as hosts``: ``hosts["r0"]`` is a
    :class:`~kvreuse.runtime.cluster.services.Host` whose prefix runs a command in that namespace.

    ``rate`` (a ``tc`` rate such as ``"10gbit"``): each host's link is shaped to it both ways
    (token bucket; this kernel has no ``netem``, so no added latency).  ``hidden``: directories a
    host does not have (each process started there sees an empty directory in their place, through a
    mount namespace of its own), as another machine would not have this one's files.  Everything
    made is removed on exit, also after a failed start.
    """

    def __init__(
        self, names: list[str], rate: str | None = None, hidden: Mapping[str, Sequence[Path]] | None = None
    ) -> None:
        if len(set(names)) != len(names) or len(names) > 200:
            raise ValueError(f"host names must be distinct and at most 200: {names}")
        self.names, self.rate, self.hidden = list(names), rate, dict(hidden or {})
        self.tag = f"kv{uuid.uuid4().hex[:6]}"  # interface names stay under 16 characters
        self.bridge = f"{self.tag}br"
        self.subnet = self._free_subnet()
        self.client_address = f"{self.subnet}.1"  # this namespace's address on the bridge
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []

    @staticmethod
    def _free_subnet() -> str:
        used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
        for third in range(100, 250):
            candidate = f"10.213.{third}"
            if f" {candidate}." not in used:
                return candidate
        raise RuntimeError("no free 10.213.x.0/24 subnet for the emulated hosts")

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __enter__(self) -> EmulatedHosts:
        try:
            self._build()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def _build(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.client_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, name in enumerate(self.names):
            ns, veth = f"{self.tag}-{name}", f"{self.tag}v{i}"
            _ip("netns", "add", ns)
            self._namespaces.append(ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge, "up")
            address = f"{self.subnet}.{10 + i}"
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            if self.rate:
                shape = ["root", "tbf", "rate", self.rate, "burst", "256kb", "latency", "50ms"]
                subprocess.run(["tc", "qdisc", "add", "dev", veth, *shape], check=True, capture_output=True)
                subprocess.run(
                    ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", *shape],
                    check=True,
                    capture_output=True,
                )
            self.hosts[name] = Host(
                address, ("ip", "netns", "exec", ns, *self._hide(self.hidden.get(name, ())))
            )

    @staticmethod
    def _hide(dirs: Sequence[Path]) -> tuple[str, ...]:
        """A prefix that mounts an empty tmpfs over each of ``dirs``, for this process only, then runs the command."""
        if not dirs:
            return ()
        mounts = " && ".join(f"mount -t tmpfs kvreuse-hidden {shlex.quote(str(d))}" for d in dirs)
        return ("unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"', "sh")

    def remove(self) -> None:
        """Delete the namespaces (their veth ends go with them) and the bridge; idempotent."""
        for ns in self._namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._namespaces.clear()
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
