"""The routing bound's replay: each replica replays only what is routed to it, through the real cache.

Expected values come from the prompts alone: with room for everything, a turn on the replica that
served the session's previous turn finds that whole prompt (its whole pages) and nothing more; a turn
elsewhere finds at most the replica's older copy of the same session."""

from __future__ import annotations

import random

from kvreuse.benchmarks.cluster.routing_bound import PAGE, REPLICAS, arrivals, generated, rates, replay_routed


def _prompts(sessions: int, turns: int) -> list[list[list[int]]]:
    rng = random.Random(0)
    system = [rng.randrange(3, 500) for _ in range(40)]
    out = []
    for _ in range(sessions):
        p, rows = list(system), []
        for _t in range(turns):
            p = p + [rng.randrange(3, 500) for _ in range(rng.randrange(20, 40))]
            rows.append(list(p))
        out.append(rows)
    return out


def test_affinity_finds_every_previous_prompt_and_round_robin_only_on_the_same_replica():
    prompts, order = _prompts(5, 6), arrivals(5, 6, think_s=4.0, service_s=1.0, seed=3)
    big = 10_000
    aff = replay_routed(prompts, order, lambda i, s: s % REPLICAS, big, "lru")
    first = {}  # a replica's first request finds nothing; later first turns, the system prompt's 2 pages
    for s, t in order:
        first.setdefault(s % REPLICAS, (s, t))
    for (s, t), cached in aff.items():
        expect = len(prompts[s][t - 1]) // PAGE * PAGE if t else 0 if first[s % REPLICAS] == (s, t) else 32
        assert cached == expect, (s, t)
    assert rates(prompts, aff, 32)["history_hit_rate"] == 1.0
    rr = replay_routed(prompts, order, lambda i, s: i % REPLICAS, big, "lru")
    where = {(s, t): i % REPLICAS for i, (s, t) in enumerate(order)}
    same = [where[s, t] == where[s, t - 1] for s, t in where if t]
    assert rates(prompts, rr, 32)["history_hit_rate"] == round(sum(same) / len(same), 4)
    assert all(rr[k] <= aff[k] for k in rr if k[1]) and sum(rr.values()) < sum(aff.values())


def test_generated_replies_are_cached_as_the_model_wrote_them():
    """With the reply as the model's output, a turn on its session's replica finds the previous
    prompt and the reply the replica decoded (all but the last token, whose KV is never computed)."""
    prompts, order = _prompts(5, 6), arrivals(5, 6, think_s=4.0, service_s=1.0, seed=3)
    replies = generated(prompts, end_id=1)  # no end token in these prompts: the whole next turn
    aff = replay_routed(prompts, order, lambda i, s: s % REPLICAS, 10_000, "lru", replies)
    for (s, t), cached in aff.items():
        if t:
            assert replies[s, t - 1] == prompts[s][t][len(prompts[s][t - 1]) :]
            assert cached == (len(prompts[s][t]) - 1) // PAGE * PAGE, (s, t)
