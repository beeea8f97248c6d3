"""How far routing alone can lift the replicas benchmark's hit rate: perfect session affinity vs round-robin.

Run from the repository root: ``python -m kvreuse.benchmarks.cluster.routing_bound [--quick]``.

The same agent sessions as ``benchmarks/cluster/replicas.py`` (its ``sessions``: a shared system prompt,
then each session's own turns, one token generated per turn), their requests in the order the
benchmark's seeded think times send them (``--service-s`` stands for a request's time in the
cluster), replayed token level through 3 replicas' real cache managers (``benchmarks/traces/belady.py``:
the scheduler, cache manager and radix tree; nothing computed).  Each replica sees only the
requests routed to it, in arrival order, so a replica is one independent replay; figures are means over ``--seeds`` arrival
orders:

* ``affinity``: every turn of a session on the same replica (sessions spread evenly): what a
  perfect cache-aware router does, and the most any router can keep on one replica's pool;
* ``round_robin``: request ``i`` to replica ``i mod 3`` in arrival order.

``--generated-replies``: each assistant turn as the model's own output, which the replica caches
as it decodes (a real agent loop sends back what the model wrote), instead of a scripted text that
no replica computed (the replicas benchmark, which generates one token a turn).

Each at pools of several shares of the sessions' working set, under the default eviction policy and
under Belady's offline optimum.  Figures: ``session_hit_rate`` (cached tokens beyond the shared
system prompt over prompt tokens beyond it, as the replicas benchmark counts a replica's own pool),
and ``history_hit_rate``: the share of turns after the first whose whole previous prompt was
cached (the request-level rate at which a turn "finds its history", 1/R for round-robin in
``docs/scaling.md``'s estimate).  The ratio affinity / round-robin at the best share is the upper
bound on what cache-aware routing can show over round-robin on this workload.
"""

from __future__ import annotations

import argparse

from kvreuse.benchmarks.cluster.replica_client import sessions, think_rng
from kvreuse.benchmarks.common import base_parser, bench_main, format_table, model_dir, progress
from kvreuse.benchmarks.traces.belady import Trace, belady, replay
from kvreuse.runtime.cache.eviction import DEFAULT_POLICY

PAGE = 16
REPLICAS = 3


def arrivals(n: int, turns: int, think_s: float, service_s: float, seed: int) -> list[tuple[int, int]]:
    """(session, turn) in the order seeded think times send them (seed 0: the replicas benchmark's)."""
    events = []
    for s in range(n):
        rng, t0 = think_rng(s, seed), 0.0
        for t in range(turns):
            t0 += rng.uniform(0, think_s) + service_s
            events.append((t0, s, t))
    return [(s, t) for _, s, t in sorted(events)]


def replay_routed(prompts, order, route, pages: int, policy: str, replies=None) -> dict[tuple[int, int], int]:
    """Cached tokens of each (session, turn), each replica replaying the requests routed to it;
    ``replies``: each turn's generated tokens (default: one token, as the replicas benchmark)."""
    per: list[list[tuple[int, int]]] = [[] for _ in range(REPLICAS)]
    for i, (s, t) in enumerate(order):
        per[route(i, s)].append((s, t))
    out = {}
    for reqs in per:
        trace: Trace = [(prompts[s][t], replies[s, t] if replies else [0]) for s, t in reqs]
        cached = belady(trace, pages, PAGE) if policy == "belady" else replay(trace, pages, PAGE, policy)
        out.update(zip(reqs, cached))
    return out


def generated(prompts, end_id: int) -> dict[tuple[int, int], list[int]]:
    """Each turn's reply as the model's own output: the tokens the next turn's prompt carries after
    this one, up to the end-of-turn token (the last turn: one token)."""
    out = {}
    for s, rows in enumerate(prompts):
        for t, p in enumerate(rows):
            nxt = rows[t + 1][len(p) :] if t + 1 < len(rows) else [end_id]
            assert t + 1 == len(rows) or rows[t + 1][: len(p)] == p, "append-only sessions"
            cut = nxt.index(end_id) if end_id in nxt else len(nxt)
            out[s, t] = nxt[:cut] or [end_id]
    return out


def rates(prompts, cached: dict[tuple[int, int], int], system_len: int) -> dict:
    own = sum(max(0, c - system_len) for c in cached.values())
    own_prompt = sum(len(prompts[s][t]) - system_len for s, t in cached)
    later = [(s, t) for s, t in cached if t]
    found = sum(cached[s, t] >= len(prompts[s][t - 1]) // PAGE * PAGE for s, t in later)
    return {"session_hit_rate": round(own / own_prompt, 4), "history_hit_rate": round(found / len(later), 4)}


KEYS = ("session_hit_rate", "history_hit_rate")


def mean_rates(runs: list[dict]) -> dict:
    """The mean over arrival orders, and round-robin's spread (``min_`` / ``max_``) across them."""
    out = {k: round(sum(r[k] for r in runs) / len(runs), 4) for k in KEYS}
    return {**out, **{f"{f.__name__}_{k}": f(r[k] for r in runs) for k in KEYS for f in (min, max)}}


def run(args: argparse.Namespace) -> dict:
    from kvreuse.runtime.loading.tokenizer import load_tokenizer

    tok = load_tokenizer(model_dir())
    convs = sessions(tok, args.sessions, args.turns, args.system_tokens, args.turn_tokens)

    def ids(messages: list[dict]) -> list[int]:
        return tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)[
            "input_ids"
        ]

    prompts = [[ids(c[t]) for t in range(args.turns)] for c in convs]
    replies = generated(prompts, tok.convert_tokens_to_ids("<|im_end|>")) if args.generated_replies else None
    system_len = len(tok.apply_chat_template(convs[0][0][:1], tokenize=True, return_dict=True)["input_ids"])
    system_len = system_len // PAGE * PAGE
    working_set = system_len + sum(len(p[-1]) - system_len for p in prompts)
    orders = [arrivals(args.sessions, args.turns, args.think_s, args.service_s, k) for k in range(args.seeds)]
    routes = {"affinity": lambda i, s: s % REPLICAS, "round_robin": lambda i, s: i % REPLICAS}
    out: dict = {
        "working_set_tokens": working_set,
        "system_len": system_len,
        "policy": DEFAULT_POLICY,
        "pools": {},
    }
    rows = []
    for share in args.pool_shares:
        pages = int(share * working_set) // PAGE
        cell = {}
        for policy in (DEFAULT_POLICY, "belady"):
            got = {name: mean_rates([rates(prompts, replay_routed(prompts, o, r, pages, policy, replies), system_len)
                                     for o in orders]) for name, r in routes.items()}  # fmt: skip
            got["ratio"] = {k: round(got["affinity"][k] / max(got["round_robin"][k], 1e-9), 2) for k in KEYS}
            cell[policy] = got
            rows.append([f"{share:.2f}", policy, got["affinity"]["session_hit_rate"], got["round_robin"]["session_hit_rate"],
                         got["ratio"]["session_hit_rate"], got["affinity"]["history_hit_rate"],
                         got["round_robin"]["history_hit_rate"], got["ratio"]["history_hit_rate"]])  # fmt: skip
            progress(f"share {share}: {policy} {got['ratio']}")
        out["pools"][f"{share}"] = {"pages_per_replica": pages, **cell}
    best = max(out["pools"].values(), key=lambda c: c[DEFAULT_POLICY]["ratio"]["session_hit_rate"])
    top = best[DEFAULT_POLICY]
    out["bound"] = {"session_hit_rate_ratio": top["ratio"]["session_hit_rate"], "at_pages_per_replica": best["pages_per_replica"],
                    # the arrival order kindest to affinity: round-robin's lowest rate against affinity's mean
                    "best_order_session_hit_rate_ratio": round(top["affinity"]["session_hit_rate"] / top["round_robin"]["min_session_hit_rate"], 2)}  # fmt: skip
    print(format_table(["pool share", "eviction", "affinity", "round-robin", "x", "history: affinity",
                        "round-robin", "x"], rows))  # fmt: skip
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("routing_bound", __doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--system-tokens", type=int, default=600)
    p.add_argument("--turn-tokens", type=int, default=120)
    p.add_argument("--think-s", type=float, default=4.0, help="as the replicas benchmark's --think-s")
    p.add_argument("--seeds", type=int, default=8, help="arrival orders (think-time seeds) averaged over")
    p.add_argument("--service-s", type=float, default=3.0, help="a request's time in the cluster (TTFT)")
    p.add_argument(
        "--generated-replies",
        action="store_true",
        help="each assistant turn is the model's own output (cached), not a scripted text (never cached)",
    )
    p.add_argument("--pool-shares", type=float, nargs="+",
                   default=[0.15, 0.2, 0.25, 0.28, 0.3, 0.33, 0.35, 0.4, 0.5, 0.75, 1.0])  # fmt: skip
    args = p.parse_args(argv)
    if args.quick:
        args.sessions, args.turns, args.system_tokens, args.turn_tokens, args.pool_shares = (
            4,
            6,
            200,
            60,
            [0.35, 1.0],
        )
    return args


def main(argv: list[str] | None = None) -> int:
    return bench_main("routing_bound", parse_args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
