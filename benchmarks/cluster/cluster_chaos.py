"""``kvreuse cluster`` left alone under faults, and its routing at the command's defaults.

Run from the repository root: ``python -m kvreuse.benchmarks.cluster.cluster_chaos [--phases chaos routing]``.
Everything goes through the real command (``kvreuse cluster`` as a subprocess, the embedded model,
fp32, 3 replicas), found by its processes as an operator would find them.

* **chaos** (``--minutes``): agent sessions (a shared system prompt, 8 turns each, then a new
  session) through the gateway while a fault every ``--fault-every-s`` (after the last one has
  recovered) SIGKILLs, in turn, a replica (the next each time), Valkey or the gateway; every other
  kill of each kind kills it again as soon as its new process appears (during its restart).  Per request: failed attempts; per turn: lost (still failing after
  ``--retry-s`` of retries, as a client would retry), and whether it found its previous prompt cached
  (cached >= the previous prompt, page-floored, less a page).  Per fault: seconds from the kill to
  the part answering again (replica ``/health``, gateway ``/workers``, Valkey ``PING``).  The
  command must still be running at the end (it never exits on its own).
* **routing**: one cluster per policy (``cache_aware``, ``round_robin``) started with the command's
  defaults, each replica's pool ``--pool-share`` of the sessions' working set; 16 sessions x 8
  turns (``benchmarks/cluster/replicas.py``'s workload, its seed 0); token hit rate, session pool hit rate,
  TTFT p50 / p99, requests per replica, against the perfect-affinity bound of
  ``results/routing_bound.json`` at the same share.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

from kvreuse.benchmarks.cluster.replica_client import MODEL, history, run_turns, sessions, stream, summary
from kvreuse.benchmarks.common import base_parser, median, model_dir, percentile, progress, write_results
from kvreuse.runtime.cluster.services import free_port

PS = 16


class RunningCluster:
    """``kvreuse cluster`` as a subprocess, and its parts found by their processes."""

    def __init__(self, work: Path, replicas: int, serve: list[str], extra: list[str] = ()) -> None:
        self.work, self.port = work, free_port()
        self.out = open(work / "cluster.out", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "kvreuse.runtime.cli.main", "cluster", "--replicas",
                                      str(replicas), "--port", str(self.port), "--workdir", str(work), *extra,
                                      "--", *serve], stdout=self.out, stderr=subprocess.STDOUT)  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        end = time.monotonic() + 600
        while not (work / "cluster.json").exists():
            if self.proc.poll() is not None or time.monotonic() > end:
                raise SystemExit(
                    f"cluster_chaos: the cluster did not start: {(work / 'cluster.out').read_text()}"
                )
            time.sleep(0.5)
        self.urls = [r["url"] for r in json.loads((work / "cluster.json").read_text())["replicas"]]

    def find(self, part: str) -> list[psutil.Process]:
        if part == "valkey":
            pattern = r"^\S*valkey-server "
        elif part == "gateway":
            pattern = r"^smg"  # SMG's process title: smg::router
        else:
            pattern = rf"cli\.main serve .*--port {self.urls[int(part[-1])].rsplit(':', 1)[1]}\b"
        out = []
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if re.search(pattern, " ".join(p.cmdline())):
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def ready(self, part: str) -> bool:
        try:
            if part == "gateway":
                return httpx.get(self.url + "/workers", timeout=2).status_code == 200
            if part == "valkey":
                return bool(self.find("valkey")) and self._replicas_see_store()
            return httpx.get(self.urls[int(part[-1])] + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def _replicas_see_store(self) -> bool:
        return all(httpx.get(u + "/health", timeout=2).json().get("status") == "ok" for u in self.urls)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(120)
        self.out.close()
        return rc


def fits(tok, convs, model: Path) -> None:
    """Every turn's prompt (and the token generated) within the model's context: a longer one is
    refused (400) on every replica, a failure of the workload, not of the cluster."""
    from kvreuse.runtime.models.config import ModelConfig

    context = ModelConfig.from_dir(model).max_position_embeddings
    longest = max(
        len(tok.apply_chat_template(cv[-1], tokenize=True, return_dict=True)["input_ids"]) for cv in convs
    )
    if longest + 1 > context:
        raise SystemExit(f"cluster_chaos: a session's last turn is {longest} tokens, over {model}'s context of "
                         f"{context}: lower --system-tokens / --turn-tokens")  # fmt: skip


def rejected(r: dict) -> bool:
    """A 4xx other than 408/429: the request itself was refused (e.g. longer than the model's context),
    which no fault explains and no retry mends; counted apart from the faults' failures."""
    return r.get("status") is not None and 400 <= r["status"] < 500 and r["status"] not in (408, 429)


def last_fault(faults: list[dict], at_s: float) -> dict | None:
    """The last fault (killed) at or before ``at_s``, if any."""
    return next((f for f in reversed(faults) if "at_s" in f and f["at_s"] <= at_s), None)


def chaos(args, tok, work: Path) -> dict:
    serve = ["--model", str(args.model), "--dtype", "float32", "--served-model-name", MODEL, "--no-ui",
             "--max-waiting", "256", "--kv-cache-memory", "512M"]  # fmt: skip
    convs = sessions(tok, 400, 8, args.system_tokens, args.turn_tokens)
    fits(tok, convs, args.model)
    c = RunningCluster(work, 3, serve)
    nxt, lock, stop = iter(range(len(convs))), threading.Lock(), threading.Event()
    turns: list[dict] = []  # per turn: session, turn, attempts failed, lost, found prefix

    def client() -> None:
        while not stop.is_set():
            with lock:
                s = next(nxt)
            prev = None
            for t in range(8):
                if stop.is_set():
                    return
                time.sleep(0.5)
                attempts, end = [], time.monotonic() + args.retry_s
                while True:
                    r = stream(c.url, convs[s][t])
                    if "error" not in r:
                        break
                    attempts.append({"at_s": round(time.monotonic() - t_start, 1), "error": r["error"],
                                     **({"detail": r["detail"]} if r.get("detail") else {})})  # fmt: skip
                    if rejected(r) or time.monotonic() > end or stop.is_set():
                        break
                    time.sleep(1.0)
                rec = {"session": s, "turn": t, "failed_attempts": attempts, "lost": "error" in r,
                       "rejected": "error" in r and rejected(r), "at_s": round(time.monotonic() - t_start, 1)}  # fmt: skip
                if "error" not in r and prev is not None:
                    rec["found_prefix"] = r["cached"] >= prev // PS * PS - PS
                    rec["cached_share"] = round(r["cached"] / prev, 4)
                with lock:
                    turns.append(rec)
                if "error" in r:
                    break  # the session is given up, as an agent would
                prev = r["prompt"]

    t_start = time.monotonic()
    clients = [threading.Thread(target=client) for _ in range(args.clients)]
    for th in clients:
        th.start()
    # a replica (the next one each time), Valkey, the gateway, in turn
    parts = [p for i in range(3) for p in (f"replica {i}", "valkey", "gateway")]
    faults, kills = [], {"replica": 0, "valkey": 0, "gateway": 0}
    t_end = time.monotonic() + args.minutes * 60
    i = 0
    while time.monotonic() + args.fault_every_s < t_end:
        time.sleep(args.fault_every_s)
        part = parts[i % len(parts)]
        i += 1
        procs = c.find(part)
        if not procs:
            faults.append({"part": part, "skipped": "not running"})
            continue
        t0 = time.monotonic()
        for p in procs:
            p.kill()
        kind = part.split()[0]
        again = kills[kind] % 2 == 1  # every other kill of a kind: again while it restarts
        kills[kind] += 1
        f = {"part": part, "during_restart": again, "at_s": round(t0 - t_start, 1)}
        if again:  # kill the new process as soon as it appears
            old = {p.pid for p in procs}
            end = time.monotonic() + 60
            while time.monotonic() < end and not (new := [p for p in c.find(part) if p.pid not in old]):
                time.sleep(0.05)
            for p in new:
                p.kill()
            f["killed_again_after_s"] = round(time.monotonic() - t0, 2)
        while not c.ready(part) and time.monotonic() - t0 < 300:
            time.sleep(0.2)
        f["recovered_s"] = round(time.monotonic() - t0, 2) if c.ready(part) else None
        f["cluster_running"] = c.proc.poll() is None
        faults.append(f)
        progress(f"fault {f}")
    remaining = t_end - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)
    stop.set()
    for th in clients:
        th.join(timeout=120)
    running = c.proc.poll() is None
    state = json.loads((work / "cluster.json").read_text())
    rc = c.stop()
    later = [r for r in turns if r["turn"] > 0 and not r["lost"]]
    by_part: dict[str, list[float]] = {}
    for f in faults:
        if f.get("recovered_s") is not None:
            by_part.setdefault(f["part"].split()[0], []).append(f["recovered_s"])
    attempts = [a for r in turns for a in r["failed_attempts"]]
    for f in faults:  # each failed attempt to the last fault before it (none before the first)
        f["failed_attempts"] = f["turns_lost"] = 0
    for r in turns:
        for a in r["failed_attempts"]:
            if f := last_fault(faults, a["at_s"]):
                f["failed_attempts"] += 1
        if r["lost"] and not r["rejected"] and (f := last_fault(faults, r["failed_attempts"][-1]["at_s"])):
            f["turns_lost"] += 1
    errors: dict[str, int] = {}
    for a in attempts:
        errors[a["error"]] = errors.get(a["error"], 0) + 1
    return {
        "minutes": args.minutes, "clients": args.clients, "faults": faults, "kills": kills,
        "turns": len(turns), "failed_attempts": len(attempts), "failed_attempts_by_error": errors,
        "failed_attempts_before_any_fault": sum(1 for a in attempts if not last_fault(faults, a["at_s"])),
        "turns_with_a_failed_attempt": sum(1 for r in turns if r["failed_attempts"]),
        "turns_lost": sum(1 for r in turns if r["lost"] and not r["rejected"]),
        "turns_rejected": sum(1 for r in turns if r["rejected"]),
        "failed_turns": [r for r in turns if r["failed_attempts"]],
        "later_turns": len(later), "found_prefix": sum(1 for r in later if r["found_prefix"]),
        "found_prefix_share": round(sum(1 for r in later if r["found_prefix"]) / max(1, len(later)), 4),
        "cached_share_median": median([r["cached_share"] for r in later]) if later else None,
        "recovery_s": {k: {"median": median(v), "max": max(v), "n": len(v)} for k, v in by_part.items()},
        "supervisor": {k: state[k] for k in ("store", "gateway", "replicas")},
        "cluster_running_at_end": running, "cluster_rc_after_sigterm": rc,
        "cluster_log_tail": (work / "cluster.out").read_text().splitlines()[-40:],
    }  # fmt: skip


def routing(args, tok, work: Path) -> dict:
    from kvreuse.runtime.models.config import ModelConfig

    model = args.model
    convs = sessions(tok, 16, 8, 600, 120)
    system = tok.apply_chat_template(convs[0][0][:1], tokenize=True, return_dict=True)["input_ids"]
    system_len = len(system) // PS * PS
    finals = [tok.apply_chat_template(cv[-1], tokenize=True, return_dict=True)["input_ids"] for cv in convs]
    working_set = system_len + sum(len(f) - system_len for f in finals)
    pool = int(args.pool_share * working_set * ModelConfig.from_dir(model).kv_bytes_per_token(4))
    serve = ["--model", str(model), "--dtype", "float32", "--served-model-name", MODEL, "--no-ui",
             "--max-waiting", "256", "--kv-cache-memory", str(pool)]  # fmt: skip
    out = {"pool_share": args.pool_share, "working_set_tokens": working_set, "pool_bytes": pool}
    for policy in ("cache_aware", "round_robin"):
        (work / policy).mkdir()
        c = RunningCluster(work / policy, 3, serve, ["--policy", policy])
        try:
            recs = [[None] * 8 for _ in convs]
            t0 = time.perf_counter()
            run_turns(c.url, convs, range(8), recs, 4.0, 0)
            flat = [r for s in recs for r in s]
            ttfts = [r["ttft_s"] for r in flat if r and "error" not in r and r["ttft_s"] is not None]
            served = [int(float(re.search(r"^kvreuse_requests_total (\S+)", httpx.get(u + "/metrics", timeout=10).text, re.M)[1]))
                      for u in c.urls]  # fmt: skip
            out[policy] = {**summary(flat, system_len), "history_pool_hit_rate": history(recs),
                           "ttft_p50_s": round(median(ttfts), 3), "ttft_p99_s": round(percentile(ttfts, 99), 3),
                           "requests_per_replica": served, "wall_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
            progress(f"{policy}: {out[policy]}")
        finally:
            c.stop()
    bound = json.loads((Path(__file__).resolve().parents[1] / "results" / "routing_bound.json").read_text())
    b = bound["pools"].get(str(args.pool_share), {}).get("hazard", {})
    out["affinity_bound"] = b.get("affinity")
    out["round_robin_replayed"] = b.get("round_robin")
    ca, rr = out["cache_aware"], out["round_robin"]
    out["session_pool_hit_ratio"] = round(
        ca["session_pool_hit_rate"] / max(rr["session_pool_hit_rate"], 1e-9), 2
    )
    if b:
        out["cache_aware_share_of_bound"] = round(
            ca["session_pool_hit_rate"] / b["affinity"]["session_hit_rate"], 3
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = base_parser("cluster_chaos", __doc__.splitlines()[0])
    p.add_argument("--phases", nargs="+", choices=["chaos", "routing"], default=["chaos", "routing"])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--fault-every-s", type=float, default=15.0)
    p.add_argument("--clients", type=int, default=6, help="sessions at once")
    p.add_argument("--retry-s", type=float, default=30.0, help="how long a client retries a failed turn")
    p.add_argument("--system-tokens", type=int, default=300)
    p.add_argument("--turn-tokens", type=int, default=80)
    p.add_argument("--pool-share", type=float, default=0.25)
    p.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded model)")
    args = p.parse_args(argv)
    args.model = args.model or model_dir()
    if args.quick:
        args.minutes, args.fault_every_s, args.clients = 2.0, 15.0, 3
    os.environ["OMP_NUM_THREADS"] = str(args.threads or 1)  # each replica's torch threads, read at its start
    from kvreuse.runtime.loading.tokenizer import load_tokenizer

    tok = load_tokenizer(args.model)
    work = Path(tempfile.mkdtemp(prefix="kvreuse-chaos-"))
    results = {"dtype": "float32", "replicas": 3}
    if "chaos" in args.phases:
        (work / "chaos").mkdir()
        results["chaos"] = chaos(args, tok, work / "chaos")
    if "routing" in args.phases:
        results["routing"] = routing(args, tok, work)
    write_results(args.out, "cluster_chaos", args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
