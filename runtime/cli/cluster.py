"""``kvreuse cluster``: N replicas behind the SMG gateway, sharing one Valkey KV tier, on one host.

::

    kvreuse cluster --replicas 3 --port 8000 -- --model HuggingFaceTB/SmolLM2-135M-Instruct
        valkey  127.0.0.1:P0   (--store-memory, LRU)         the shared tier every replica writes through to
        replica 127.0.0.1:P1.. kvreuse serve <args after --> --kv-shared-store valkey://:PASSWORD@127.0.0.1:P0
        gateway 127.0.0.1:8000 smg launch --worker-urls ... --policy cache_aware --cache-threshold 0.5 ...

Clients talk to the gateway (OpenAI API); it routes each request to the replica whose cache most
likely holds its prefix (SMG's approximate radix tree per worker, balanced by the load each replica
reports at ``/v1/loads``), with the settings the routing benchmark measured (``GATEWAY_DEFAULTS``).
Every part that exits (Valkey, a replica, the gateway) is started again on its address, a failed
restart retried with backoff (``runtime/cluster/supervisor.py``); meanwhile the gateway sends a dead
replica's sessions elsewhere and they read their prefixes from the shared tier.
``kvreuse cluster metrics|reset --workdir W`` scrape or reset every replica of the cluster running there.  With ``--routing
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
import time
from pathlib import Path

from kvreuse.runtime.cluster.cluster import (
    GATEWAY_DEFAULTS,
    MANUAL_POLICY_ARGS,
    ROUTINGS,
    SECRET_FLAG,
    Cluster,
)
from kvreuse.runtime.cluster.operator import ClusterFiles, reset_all, scrape_all
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
        "--workdir", type=Path, default=None,
        help="logs of every process and cluster.json, the parts' addresses, pids and restarts (default: a temp directory)",
    )  # fmt: skip
    p.add_argument(
        "--gateway-arg", action="append", default=[], metavar="ARG",
        help="one more argument to `smg launch` (repeat: --gateway-arg=--cache-threshold --gateway-arg=0.3); a flag "
        f"given here replaces the default's: {' '.join(GATEWAY_DEFAULTS)}",
    )  # fmt: skip
    return p


def main(argv: list[str]) -> int:
    if argv[:1] in (["reset"], ["metrics"]):
        return operator_command(argv)
    ours, serve_args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    args = build_parser().parse_args(ours)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster = Cluster(args.replicas, serve_args, args.policy, args.shared_store, args.store_memory,
                      args.port, args.workdir, routing=args.routing,
                      gateway_args=(MANUAL_POLICY_ARGS if args.policy == "manual" else []) + args.gateway_arg)  # fmt: skip
    try:
        with cluster:
            say(f"gateway {cluster.url} ({args.policy}, {args.routing} routing; smg {' '.join(cluster.gateway_args)}) "
                f"over {cluster.n} replicas: {' '.join(cluster.worker_urls)}; shared KV store "
                f"{cluster.public_store_url or 'none'}{_signing(cluster)}; logs and cluster.json in {cluster.workdir}")  # fmt: skip
            cluster.supervise(say)
            stop.wait()
    except (ServiceError, ValueError) as e:
        print(f"kvreuse cluster: error: {e}", file=sys.stderr)
        return 2
    return 0


def say(line: str) -> None:
    print(f"kvreuse cluster: {time.strftime('%H:%M:%S')} {line}", flush=True)


def _signing(cluster: Cluster) -> str:
    if cluster.store is None:
        return ""
    if cluster.secret_file:
        return " (password; entries signed with the key in kv-shared-secret)"
    return f" (password; entries unsigned: this kvreuse serve has no {SECRET_FLAG})"


def operator_command(argv: list[str]) -> int:
    """``kvreuse cluster reset|metrics --workdir W``: every replica of the cluster running there."""
    p = argparse.ArgumentParser(prog=f"kvreuse cluster {argv[0]}")
    p.add_argument("--workdir", type=Path, required=True, help="the running cluster's --workdir")
    args = p.parse_args(argv[1:])
    try:
        files = ClusterFiles(args.workdir)
    except ValueError as e:
        print(f"kvreuse cluster: error: {e}", file=sys.stderr)
        return 2
    if argv[0] == "metrics":
        sys.stdout.write(scrape_all(files.replica_urls, files.headers()))
        return 0
    answers = reset_all(files.replica_urls, files.headers())
    for url, answer in answers.items():
        print(f"{url}: {answer}")
    return 0 if all(a == "ok" for a in answers.values()) else 1
