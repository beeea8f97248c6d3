"""Starting and stopping the tensor-parallel ranks on one host (spawned processes), or joining a group
that ``torchrun`` started (see docs/scaling.md).

Rank 0 is the engine: scheduler, radix tree, sampling.  Ranks 1..N-1 run ``worker`` loops that
receive each step's batch and run their shard of the same forward.  Failure is loud and bounded:
rank 0 checks its workers before every step, a collective with a dead peer fails (gloo/NCCL see
the closed connection) within ``TIMEOUT_S`` at worst, and a worker whose parent is gone exits.
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT_S = 120.0  # the longest any collective waits for a peer (a rank that died mid-step)


class TPError(RuntimeError):
    """A tensor-parallel rank failed; the engine cannot continue (the message names the rank)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Group:
    """One tensor-parallel group's collectives, on a process group of its own.

    Not torch.distributed's default (global) group: two engines in one process (a test comparing
    TP=2 with TP=1, say) each have their own.  NCCL across GPUs, gloo on CPU.
    """

    def __init__(self, rank: int, world: int, port: int, device_type: str, host: str = "127.0.0.1") -> None:
        timeout = datetime.timedelta(seconds=TIMEOUT_S)
        self.store = dist.TCPStore(host, port, world, rank == 0, timeout=timeout)
        self.port = self.store.port
        self.rank, self.world = rank, world
        store = dist.PrefixStore("kvreuse-tp", self.store)
        if device_type == "cuda":
            opts = dist.ProcessGroupNCCL.Options()
            self.pg = dist.ProcessGroupNCCL(store, rank, world, opts)
        else:
            self.pg = dist.ProcessGroupGloo(store, rank, world, timeout)

    def broadcast(self, t: torch.Tensor, src: int = 0) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        self.pg.broadcast([t], opts).wait()

    def all_reduce(self, t: torch.Tensor) -> None:
        self.pg.allreduce([t]).wait()


def rank_device(device: str, rank: int) -> str:
    """Each rank its own GPU (``cuda:rank``); every CPU rank on the CPU."""
    return f"cuda:{rank}" if device.startswith("cuda") else device


def watch_parent() -> None:
    """A spawned rank exits when rank 0's process is gone (instead of waiting in a collective)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watch, name="kvreuse-tp-watchdog", daemon=True).start()


def torchrun_world() -> int:
    """``WORLD_SIZE`` when torchrun (or any launcher setting RANK/WORLD_SIZE/MASTER_*) started us, else 0."""
    return int(os.environ.get("WORLD_SIZE", "0")) if "RANK" in os.environ else 0


def join_torchrun(device_type: str):
    """This rank's group from torchrun's environment; the group's store listens on MASTER_PORT + 1
    (torchrun's own rendezvous may hold MASTER_PORT) on MASTER_ADDR, where rank 0 runs."""
    from kvreuse.runtime.runner.distributed.sharding import TPGroup

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500")) + 1
    set_rank_threads(int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    return TPGroup(rank, world, Group(rank, world, port, device_type, host))


class Workers:
    """Rank 0's handle on ranks 1..world-1, spawned on this host."""

    def __init__(self, world: int, target: Callable, args: tuple, device_type: str) -> None:
        ctx = mp.get_context("spawn")
        port = _free_port()
        self.procs = [
            ctx.Process(target=target, args=(rank, world, port, *args), daemon=True, name=f"kvreuse-tp{rank}")
            for rank in range(1, world)
        ]
        for p in self.procs:
            p.start()
        try:
            self.group = Group(0, world, port, device_type)
        except Exception as e:
            self.kill()
            raise TPError(f"tensor-parallel group did not form: {e}".splitlines()[0]) from e

    def check(self) -> None:
        """Raise TPError if a worker has exited (rank 0 calls this before every step)."""
        for rank, p in enumerate(self.procs, start=1):
            if p.exitcode is not None:
                raise TPError(f"tensor-parallel rank {rank} exited (code {p.exitcode}); the engine stops")

    def kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(5)

    def close(self, stop: Callable[[], None]) -> None:
        """Tell the workers to stop (``stop`` broadcasts the STOP header), wait, tear the group down."""
        try:
            if all(p.is_alive() for p in self.procs):
                stop()
            for p in self.procs:
                p.join(10)
        finally:
            self.kill()


def set_rank_threads(world: int) -> None:
    """CPU ranks share the cores: each gets its part, so ranks do not oversubscribe them."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
