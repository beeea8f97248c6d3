"""Replicas behind the SMG gateway sharing a Valkey KV tier: routing, failover, store throughput.

Run from the repository root: ``python -m kvreuse.benchmarks.cluster.replicas [--quick] [--out PATH] [--threads N]``
(``--threads``: torch threads of each replica process, default 1).

One ``kvreuse cluster`` of 3 replicas of the embedded model (fp32, CPU) and a Valkey server; gateways
(``smg launch``) with different policies in front of the same replicas; every phase starts from
reset caches (``/v1/cache/reset`` on each replica, which also empties the shared store).

* **routing**: ``--sessions`` concurrent agent sessions of ``--turns`` turns (one system prompt they
  all share, then each its own user/assistant turns, append-only, a think time of up to ``--think-s``
  before each; one token generated: TTFT is what is measured), streamed through the gateway, with each
  replica's pool a share of the sessions' working set (``--pool-shares``; one cluster each): a single
  replica (no gateway), then 2 and 3 replicas with SMG's ``cache_aware`` (its approximate text tree
  per replica), ``events_cache_aware`` (the same policy over the replicas' gRPC fronts, its index
  built from their KV cache events), ``manual`` (the session key ``X-SMG-Routing-Key`` pinned to a
  worker, new keys to the least-loaded one), ``round_robin``, and at 3 replicas ``consistent_hashing``
  on the session key (and, asked for with ``--cases``, Ray Serve's prefix-aware router and its
  round-robin in SMG's place: ``ray_prefix_3`` / ``ray_round_robin_3``,
  ``benchmarks/cluster/ray_gateway.py``).  Token hit rate (cached / prompt tokens), split into the replica's
  own pool and the shared tier; the share of turns that find their whole previous prompt in the pool
  (``history_pool_hit_rate``); TTFT median / p90; requests per replica.  ``--repeats N`` runs every
  case N times, interleaved, each time with other think times (round-robin's rate depends on the
  order the requests arrive in), and pools the records.  ``benchmarks/cluster/routing_bound.py`` replays the
  same sessions token level for what a perfect router could reach.
* **failover**: 3 replicas, cache-aware; turns 1-4 of every session (turn 4 sent one session at a
  time, to see which replica holds each), the replica holding the most sessions SIGKILLed, turns 5-8.
  For the moved sessions' turn 5: cached tokens by tier against the previous prompt, TTFT against a
  cold recompute of the same-length prompt (its first character changed); errors over all turns.
* **store**: pages/s and GB/s writing and reading the embedded model's pages (16 tokens, fp32) to the
  Valkey server, and to the disk tier (``DiskStore``) in the same run.

``--hosts emulated`` runs the same across hosts: the store, each replica and the gateway in a network
namespace of its own on one bridge (``benchmarks/cluster/emulated_hosts.py``), links shaped to
``--link-rate``; this process, the client, is on the bridge too.  Separate networks, not machines:
the CPUs are shared as on loopback.

Goals (issue 36): cache-aware >= 3x round-robin's pool hit rate at 3 replicas; a moved session reads
>= 90% of its previous prompt from the shared tier; no lost or 5xx request but those in flight on the
killed replica.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch

from kvreuse.benchmarks.cluster.replica_client import (
    MODEL,
    SHARED_TIER,
    history,
    metric,
    pool_tokens,
    reset,
    run_turns,
    served,
    sessions,
    stream,
    summary,
)
from kvreuse.benchmarks.common import base_parser, median, model_dir, progress, write_results

SWEEP_CASES = ["single", "cache_aware_3", "events_cache_aware_3", "manual_3", "round_robin_3"]
ALL_CASES = ["single", "cache_aware_2", "events_cache_aware_2", "manual_2", "round_robin_2", "cache_aware_3",
             "events_cache_aware_3", "manual_3", "session_hash_3", "round_robin_3"]  # fmt: skip


def routing(cluster, convs, args, cases_run: list[str]) -> dict:
    from kvreuse.runtime.cluster.cluster import MANUAL_POLICY_ARGS as manual

    out = {}
    cases = [("single", 1, None, []), ("cache_aware_2", 2, "cache_aware", []), ("manual_2", 2, "manual", manual),
             ("round_robin_2", 2, "round_robin", []), ("cache_aware_3", 3, "cache_aware", []),
             ("manual_3", 3, "manual", manual), ("session_hash_3", 3, "consistent_hashing", []),
             ("round_robin_3", 3, "round_robin", []),
             # the same policy over the replicas' gRPC fronts, its index built from their KV cache events
             ("events_cache_aware_2", 2, "cache_aware", []), ("events_cache_aware_3", 3, "cache_aware", []),
             # the alternative gateway, Ray Serve, over the same HTTP replicas (only when asked: --cases)
             ("ray_prefix_3", 3, "ray:prefix", []), ("ray_round_robin_3", 3, "ray:round_robin", [])]  # fmt: skip
    runs: dict[str, list] = {c[0]: [] for c in cases if c[0] in cases_run}
    for seed in range(args.repeats):  # repeats interleaved (A B A B), each with its own think times
        for name, n, policy, extra in (c for c in cases if c[0] in runs):
            recs, shared, per_replica, wall = one_case(
                cluster, convs, args, name.startswith("events_"), n, policy, extra, seed
            )
            # each repeat's own figures, once (``summary`` also warns when the two shared-tier counts disagree)
            rep = summary([r for s in recs for r in s], args.system_len, shared)
            runs[name].append((recs, shared, per_replica, wall, rep))
            progress(f"{name} #{seed}: {rep}")
    for name, rs in runs.items():
        recs = [row for r in rs for row in r[0]]
        out[name] = {**summary([r for s in recs for r in s], args.system_len, sum(r[1] for r in rs)),
                     "wall_s": round(sum(r[3] for r in rs), 1), "history_pool_hit_rate": history(recs),
                     "requests_per_replica": [sum(x) for x in zip(*(r[2] for r in rs))],
                     "per_repeat_session_pool_hit_rate": [r[4]["session_pool_hit_rate"] for r in rs]}  # fmt: skip
        progress(f"{name}: {out[name]}")
    return out


def one_case(cluster, convs, args, events: bool, n: int, policy: str | None, extra: list[str], seed: int):
    """One routing case from reset caches: (records, shared-tier tokens the replicas read, requests per
    replica, wall seconds)."""
    from kvreuse.runtime.cluster.services import start_gateway

    urls = cluster.urls[:n]
    reset(cluster.urls)
    workers = (cluster.worker_urls if events else cluster.urls)[:n]
    if policy is None:
        gw, url = None, urls[0]
    elif policy.startswith("ray:"):
        from kvreuse.benchmarks.cluster.ray_gateway import start_ray_gateway

        gw, url = start_ray_gateway(cluster.workdir, workers, policy[4:], args.ray_imbalanced_threshold)
    else:
        gw, url = start_gateway(cluster.workdir, workers, policy, extra=args.gateway_args + extra,
                                host=cluster.placement.gateway)  # fmt: skip
    try:
        before, shared_before = served(urls), metric(urls, SHARED_TIER)
        recs = [[None] * args.turns for _ in convs]
        t0 = time.perf_counter()
        run_turns(url, convs, range(args.turns), recs, args.think_s, seed)
        wall = time.perf_counter() - t0
        after, shared_after = served(urls), metric(urls, SHARED_TIER)
    finally:
        if gw is not None:
            gw.stop()
    # the replicas' own count of tokens read from the shared tier: a response through the gateway's
    # gRPC path is the gateway's, without kvreuse's per-request split by tier
    shared = sum(a - b for a, b in zip(shared_after, shared_before))
    return recs, shared, [a - b for a, b in zip(after, before)], wall


def failover(cluster, convs, args) -> dict:
    from kvreuse.runtime.cluster.services import start_gateway

    reset(cluster.urls)
    gw, url = start_gateway(cluster.workdir, cluster.urls, "cache_aware", extra=args.gateway_args,
                            host=cluster.placement.gateway)  # fmt: skip
    recs = [[None] * args.turns for _ in convs]
    try:
        run_turns(url, convs, range(3), recs, args.think_s)
        owner = []
        for s in range(len(convs)):  # turn 4 one session at a time: which replica holds each session
            before = served(cluster.urls)
            recs[s][3] = stream(url, convs[s][3], s)
            owner.append(max(range(len(cluster.urls)), key=lambda i: served(cluster.urls)[i] - before[i]))
        victim = max(range(len(cluster.urls)), key=owner.count)
        cluster.kill_replica(victim)
        progress(
            f"killed replica {victim}, holding sessions {[s for s in range(len(convs)) if owner[s] == victim]}"
        )
        run_turns(url, convs, range(4, args.turns), recs, args.think_s)
        moved = [s for s in range(len(convs)) if owner[s] == victim]
        cold = []
        for s in moved:  # the same prompt with its first characters changed: nothing of it is cached anywhere
            cold.append(stream(url, _uncached(convs[s][4], s)))
        probes = restart_probe(cluster, convs, victim, moved)
    finally:
        gw.stop()
    turn5 = [recs[s][4] for s in moved]
    ok5 = [r for r in turn5 if "error" not in r]
    prev = [recs[s][3]["prompt"] for s, r in zip(moved, turn5) if "error" not in r]
    return {
        "victim": victim, "sessions_per_replica": [owner.count(i) for i in range(len(cluster.urls))],
        "moved_sessions": moved, "all_turns": summary([r for s in recs for r in s]),
        "errors": [(s, t, r["error"]) for s, row in enumerate(recs) for t, r in enumerate(row) if r and "error" in r],
        "moved_turn5": {
            "by_tier": [r["tiers"] for r in ok5], "prompt_tokens": [r["prompt"] for r in ok5],
            "previous_prompt_tokens": prev,
            "shared_share_of_previous_prompt": [round(r["tiers"].get("shared", 0) / p, 4) for r, p in zip(ok5, prev)],
            "cached_share_of_previous_prompt": [round(r["cached"] / p, 4) for r, p in zip(ok5, prev)],
            # under load: every session's turn 5 arrives at once on the two survivors; the cold figure is
            # each prompt alone afterwards, so the two are not comparable (see "restarted_replica")
            "ttft_median_s_under_load": round(median([r["ttft_s"] for r in ok5]), 4) if ok5 else None,
            "cold_ttft_median_s_alone": round(median([c["ttft_s"] for c in cold if "error" not in c]), 4) if any("error" not in c for c in cold) else None,
            "cold_errors": [c["error"] for c in cold if "error" in c],
            "cold_cached_tokens": [c.get("cached") for c in cold],
        },
        "moved_turns_6_8": summary([recs[s][t] for s in moved for t in range(5, args.turns)]),
        "restarted_replica": probes,
    }  # fmt: skip


def _uncached(messages: list[dict], s: int | str) -> list[dict]:
    """``messages`` with the first characters changed (a tag of its own): no prefix of it is cached."""
    msgs = [dict(m) for m in messages]
    msgs[0]["content"] = f"#{s}#" + msgs[0]["content"][len(f"#{s}#") :]
    return msgs


def restart_probe(cluster, convs, victim: int, moved: list[int]) -> dict:
    """The killed replica restarted (empty pool); each moved session's last prompt sent to it alone,
    read from the shared tier, then the same prompt made uncached (recomputed), one at a time: the
    TTFT of a moved session's next turn with and without the shared tier, same replica, no load."""
    cluster.restart_replica(victim)
    url = cluster.urls[victim]
    shared, cold = [], []
    for s in moved:
        shared.append(stream(url, convs[s][-1]))
        cold.append(stream(url, _uncached(convs[s][-1], f"probe{s}")))
    ok = [(a, b) for a, b in zip(shared, cold) if "error" not in a and "error" not in b]
    return {"by_tier": [a["tiers"] for a, _ in ok], "prompt_tokens": [a["prompt"] for a, _ in ok],
            "ttft_shared_s": [round(a["ttft_s"], 4) for a, _ in ok], "ttft_cold_s": [round(b["ttft_s"], 4) for _, b in ok],
            "ttft_shared_median_s": round(median([a["ttft_s"] for a, _ in ok]), 4) if ok else None,
            "ttft_cold_median_s": round(median([b["ttft_s"] for _, b in ok]), 4) if ok else None,
            "cold_over_shared": round(median([b["ttft_s"] for _, b in ok]) / median([a["ttft_s"] for a, _ in ok]), 2) if ok else None}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("replicas", __doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--system-tokens", type=int, default=600, help="the shared system prompt")
    p.add_argument("--turn-tokens", type=int, default=120, help="tokens a turn adds (assistant + user)")
    p.add_argument("--store-pages", type=int, default=512, help="pages written and read in the store test")
    # fmt: off
    p.add_argument("--cache-threshold", type=float, default=0.5, help="SMG cache_aware: prefix match share to follow")
    p.add_argument("--balance-abs", type=int, default=2, help="SMG cache_aware: in-flight gap that overrides affinity")
    p.add_argument("--balance-rel", type=float, default=1.5, help="SMG cache_aware: ... with this in-flight ratio")
    p.add_argument("--phases", nargs="+", choices=["routing", "failover", "store"], default=["routing", "failover", "store"])
    p.add_argument("--think-s", type=float, default=4.0, help="most seconds a session waits before a turn")
    p.add_argument("--pool-shares", type=float, nargs="+", default=[0.35, 0.0],
                   help="each replica's KV pool as a share of the sessions' working set, one cluster each (0: the "
                   "serve default, 1G: every session fits); the first share also runs the 2-replica and hashing cases")
    p.add_argument("--ray-imbalanced-threshold", type=float, default=2.0,
                   help="Ray's prefix router: queue gap that overrides affinity (as SMG's --balance-abs)")
    p.add_argument("--repeats", type=int, default=1, help="routing runs of each case (other think times), interleaved")
    p.add_argument("--cases", nargs="*", default=[], help="routing cases to run (default: see --pool-shares)")
    p.add_argument("--hosts", choices=["loopback", "emulated"], default="loopback",
                   help="'emulated': store, replicas and gateway each on a network namespace of its own")
    p.add_argument("--link-rate", default=None, help="with --hosts emulated: each host's link rate (tc, e.g. 10gbit)")
    # fmt: on
    args = p.parse_args(argv)
    if args.quick:
        args.sessions, args.turns, args.system_tokens, args.turn_tokens, args.store_pages = 4, 6, 200, 60, 64
    args.gateway_args = ["--cache-threshold", str(args.cache_threshold), "--balance-abs-threshold", str(args.balance_abs),
                         "--balance-rel-threshold", str(args.balance_rel), "--health-check-interval-secs", "1",
                         "--health-failure-threshold", "1"]  # fmt: skip
    return args


def placement(args: argparse.Namespace, stack: contextlib.ExitStack):
    """Where the store, the 3 replicas and the gateway run (``--hosts``)."""
    from kvreuse.runtime.cluster.cluster import Placement

    if args.hosts == "loopback":
        return Placement()
    from kvreuse.benchmarks.cluster.emulated_hosts import EmulatedHosts, unavailable

    if why := unavailable():
        raise SystemExit(f"replicas: error: --hosts emulated: {why}")
    hosts = stack.enter_context(EmulatedHosts(["store", "r0", "r1", "r2", "gw"], args.link_rate))
    return Placement(hosts["store"], (hosts["r0"], hosts["r1"], hosts["r2"]), hosts["gw"])


def loopback_store(work: Path, model: Path, pages: int) -> dict:
    from kvreuse.benchmarks.cluster.store_throughput import compare
    from kvreuse.runtime.cluster.services import start_valkey

    (work / "loopback").mkdir(exist_ok=True)
    svc, url = start_valkey(work / "loopback", "4gb")
    try:
        return compare(url, work / "loopback", model, pages)
    finally:
        svc.stop()


def run(args: argparse.Namespace) -> dict:
    # SIGTERM unwinds like Ctrl-C: the cluster's processes and the emulated hosts are removed, not left
    # running; a second SIGTERM (``timeout`` passes its own on) must not cut that short
    def terminate(*_) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.exit(143)

    signal.signal(signal.SIGTERM, terminate)
    with contextlib.ExitStack() as stack:
        return _run(args, placement(args, stack))


def _run(args: argparse.Namespace, where) -> dict:
    from kvreuse.benchmarks.cluster.store_throughput import compare
    from kvreuse.runtime.cluster.cluster import Cluster
    from kvreuse.runtime.loading.tokenizer import load_tokenizer
    from kvreuse.runtime.models.config import ModelConfig

    model = model_dir()
    threads = args.threads or 1
    os.environ["OMP_NUM_THREADS"] = str(threads)  # each replica process: torch reads it at start
    torch.set_num_threads(threads)  # this process's store test too
    tok = load_tokenizer(model)
    convs = sessions(tok, args.sessions, args.turns, args.system_tokens, args.turn_tokens)
    system = tok.apply_chat_template(convs[0][0][:1], tokenize=True, return_dict=True)["input_ids"]
    args.system_len = len(system) // 16 * 16  # the shared system prompt, page-rounded
    finals = [tok.apply_chat_template(c[-1], tokenize=True, return_dict=True)["input_ids"] for c in convs]
    working_set = args.system_len + sum(len(f) - args.system_len for f in finals)  # distinct prompt tokens
    work = Path(tempfile.mkdtemp(prefix="kvreuse-replicas-"))
    serve = ["--dtype", "float32", "--served-model-name", MODEL, "--no-ui", "--max-waiting", "256"]
    results: dict = {"dtype": "float32", "threads_per_replica": threads, "replicas": 3,
                     "workload": {k: getattr(args, k) for k in ("sessions", "turns", "system_tokens", "turn_tokens", "think_s")},
                     "working_set_tokens": working_set, "gateway": "smg launch " + " ".join(args.gateway_args),
                     "hosts": {"kind": args.hosts, "link_rate": args.link_rate,
                               "addresses": {"store": where.store.address, "replicas": [h.address for h in where.replicas],
                                             "gateway": where.gateway.address}},
                     "routing": {}}  # fmt: skip
    per_token = ModelConfig.from_dir(model).kv_bytes_per_token(4)
    for i, share in enumerate(args.pool_shares):
        # the regime routing is for: one replica's pool holds part of the sessions, not all of them
        pool = ["--kv-cache-memory", str(int(share * working_set * per_token))] if share else []
        cases = args.cases or (ALL_CASES if i == 0 else SWEEP_CASES)
        with Cluster(
            3, serve + pool, store_memory="4gb", workdir=work, port=None, routing="events", placement=where
        ) as cluster:
            key = f"pool_share_{share}"
            progress(f"{key}: {pool_tokens(cluster.urls[0])} pool tokens per replica")
            if "routing" in args.phases:
                results["routing"][key] = {"pool_tokens_per_replica": pool_tokens(cluster.urls[0]),
                                           **routing(cluster, convs, args, cases)}  # fmt: skip
            if i == 0 and "failover" in args.phases:
                results["failover"] = failover(cluster, convs, args)
            if i == 0 and "store" in args.phases:
                results["store"] = compare(cluster.store_url, work, model, args.store_pages)
                if args.hosts == "emulated":  # the same pages through a Valkey on this host's loopback
                    results["store_loopback"] = loopback_store(work, model, args.store_pages)
    results["goals"] = {**ratios(results["routing"]), **failover_goals(results)}
    progress(f"goals: {results['goals']}")
    return results


KEYS = ("hit_rate", "pool_hit_rate", "session_pool_hit_rate")


def ratios(routing_results: dict) -> dict:
    """Each 3-replica case over round-robin behind the same gateway kind (SMG's; Ray's for Ray's router)."""
    out = {}
    for key, r in routing_results.items():
        for name, c in r.items():
            base = "ray_round_robin_3" if name.startswith("ray_") else "round_robin_3"
            if name.endswith("_3") and name != base and base in r:
                out[f"{key}/{name}_over_{base}"] = {k: round(c[k] / max(r[base][k], 1e-9), 2) for k in KEYS}
    return out


def failover_goals(results: dict) -> dict:
    if "failover" not in results:
        return {}
    f = results["failover"]["moved_turn5"]
    errors = sum(c["errors"] for r in results["routing"].values() for c in r.values() if isinstance(c, dict))
    return {
        "moved_session_min_shared_share": min(f["shared_share_of_previous_prompt"], default=None),
        "moved_session_min_cached_share": min(f["cached_share_of_previous_prompt"], default=None),
        "errors_outside_the_kill": len(results["failover"]["errors"]) + errors,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    write_results(args.out, "replicas", args, run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
