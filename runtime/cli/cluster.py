"""``kvreuse cluster``: N replicas behind the SMG gateway, sharing one Valkey KV tier, on one host.

::

    kvreuse cluster --replicas 3 --port 8000 -- --model HuggingFaceTB/SmolLM2-135M-Instruct
        valkey  127.0.0.1:P0   (--store-memory, LRU)         the shared tier every replica writes through to
        replica 127.0.0.1:P1.. kvreuse serve <args after --> --kv-shared-store valkey://127.0.0.1:P0
        gateway 127.0.0.1:8000 smg launch --worker-urls ... --policy cache_aware

Clients talk to the gateway (OpenAI API); it routes each request to the replica whose cache most
likely holds its prefix (SMG's approximate radix tree per worker, balanced by the load each replica
reports at ``/v1/loads``).  A replica that exits is started again on its port; meanwhile the gateway
sends its sessions elsewhere and they read their prefixes from the shared tier.  With ``--routing
events`` each replica also serves SMG's gRPC engine service (``kvreuse serve --grpc-port``), the
gateway is given ``grpc://`` workers and routes by the pages each replica reports it stores and
evicts (its KV cache events), not by a guess.  Ctrl-C / SIGTERM
stops everything.  Across hosts the same parts run one per host: see docs/scaling.md.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from kvreuse.runtime.cluster.cluster import MANUAL_POLICY_ARGS, ROUTINGS, Cluster
from kvreuse.runtime.cluster.services import ServiceError

POLICIES = [
    "cache_aware",
    "round_robin",
    "power_of_two",
    "least_load",
    "prefix_hash",
    "consistent_hashing",
    "random",
    "manual",
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvreuse cluster",
        description="N kvreuse replicas behind the SMG gateway, sharing a Valkey KV tier; arguments after "
        "'--' go to every replica's `kvreuse serve`.",
    )
    p.add_argument("--replicas", type=int, default=2, help="replicas to start (default 2)")
    p.add_argument("--port", type=int, default=8000, help="the gateway's port on 127.0.0.1 (default 8000)")
    p.add_argument(
        "--policy", choices=POLICIES, default="cache_aware",
        help="the gateway's routing policy; 'manual': each session pinned to one replica by the "
        "X-SMG-Routing-Key header its client sends, new sessions to the least-loaded replica",
    )  # fmt: skip
    p.add_argument(
        "--routing", choices=ROUTINGS, default="approx",
        help="cache_aware's view of the replicas' caches: 'approx' (default), the gateway's own tree of the "
        "text it sent, over HTTP; 'events', exact: each replica serves SMG's gRPC engine service and "
        "streams its KV cache events (pages stored and evicted) into the gateway's index",
    )  # fmt: skip
    p.add_argument(
        "--shared-store",
        default="start",
        help="'start' (default): a Valkey server on a free port; a valkey:// URL: that server; 'none': no shared tier",
    )
    p.add_argument(
        "--store-memory", default="4gb", help="the started Valkey server's maxmemory (LRU beyond it)"
    )
    p.add_argument(
        "--workdir", type=Path, default=None, help="logs of every process (default: a temp directory)"
    )
    return p


def main(argv: list[str]) -> int:
    ours, serve_args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    args = build_parser().parse_args(ours)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster = Cluster(args.replicas, serve_args, args.policy, args.shared_store, args.store_memory,
                      args.port, args.workdir, routing=args.routing,
                      gateway_args=MANUAL_POLICY_ARGS if args.policy == "manual" else None)  # fmt: skip
    try:
        with cluster:
            print(f"kvreuse cluster: gateway {cluster.url} ({args.policy}, {args.routing} routing) over "
                  f"{cluster.n} replicas: {' '.join(cluster.worker_urls)}; shared KV store {cluster.store_url or 'none'}; logs in {cluster.workdir}",
                  flush=True)  # fmt: skip
            while not stop.wait(1.0):
                for i, svc in enumerate(cluster.replicas):
                    if not svc.alive:
                        print(
                            f"kvreuse cluster: replica {i} exited ({svc.proc.returncode}); restarting",
                            flush=True,
                        )
                        cluster.restart_replica(i)
    except (ServiceError, ValueError) as e:
        print(f"kvreuse cluster: error: {e}", file=sys.stderr)
        return 2
    return 0
