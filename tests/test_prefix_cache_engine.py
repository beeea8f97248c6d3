"""The radix cache in the engine: prefixes shared across conversations and concurrent requests, and
eviction under a pool smaller than the working set."""

from __future__ import annotations

import torch

from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.request import Request
from tests.engine_drive import (
    assert_logits_close,
    assert_no_request_pages,
    greedy,
    random_ids,
    run_checked,
    tiny_engine,
)

PS = 16


def _run_one(eng: Engine, prompt: list[int], max_tokens: int = 4) -> Request:
    req = eng.make_request(prompt, greedy(max_tokens))
    run_checked(eng, [req])
    return req


def _floor(n: int, ps: int = PS) -> int:
    return n // ps * ps


def _distinct_pages(seqs: list[list[int]], ps: int = PS) -> int:
    """Pages a duplicate-free tree needs to hold every whole page of ``seqs``."""
    return len({tuple(s[: k * ps]) for s in seqs for k in range(1, len(s) // ps + 1)})


def _computed(reqs: list[Request]) -> list[list[int]]:
    """What finished requests computed: everything but the last sampled token."""
    return [r.tokens[:-1] for r in reqs]


def test_interleaved_conversations_share_system_prompt(tiny_models):
    eng = tiny_engine(tiny_models[("llama", False)])
    gen = torch.Generator().manual_seed(0)
    shared = random_ids(gen, 70)  # system prompt + tool schemas
    seqs = {"a": shared + [5] + random_ids(gen, 20), "b": shared + [6] + random_ids(gen, 9)}
    prev: dict[str, Request] = {}
    for turn in range(3):
        for conv in ("a", "b"):
            req = _run_one(eng, seqs[conv])
            if turn == 0 and conv == "a":
                assert req.cached_tokens == 0
            elif turn == 0:
                assert req.cached_tokens == _floor(len(shared))  # b's first request reuses a's prefix
            else:
                assert req.cached_tokens == _floor(len(prev[conv].tokens) - 1)  # its own history
            assert req.cached_tokens + req.prefilled_tokens == req.num_prompt
            prev[conv] = req
            seqs[conv] = req.tokens + random_ids(gen, 13)
    assert eng.stats().cached_tokens >= 5 * _floor(len(shared))
    assert_no_request_pages(eng)


def test_mid_page_divergence_reuses_every_page_before_it(tiny_models):
    eng = tiny_engine(tiny_models[("llama", False)])
    gen = torch.Generator().manual_seed(1)
    first = random_ids(gen, 60)
    _run_one(eng, first)
    branch = first[:37] + [first[37] % 500 + 4] + random_ids(gen, 12)  # differs from token 37 on
    req = _run_one(eng, branch)
    assert req.cached_tokens == 32
    assert req.prefilled_tokens == len(branch) - 32
    assert_no_request_pages(eng)


def test_concurrent_requests_share_after_first_chunk_is_inserted(tiny_models):
    eng = tiny_engine(tiny_models[("llama", False)], chunk_size=64)
    gen = torch.Generator().manual_seed(2)
    prefix = random_ids(gen, 200)
    a = eng.make_request(prefix + random_ids(gen, 10), greedy(3))
    b = eng.make_request(prefix + random_ids(gen, 10), greedy(3))
    run_checked(eng, [a, b])
    # a prefills in chunks of 64; b is admitted in the step a's last chunk leaves budget for, by
    # when a's first 192 tokens (12 whole pages) are in the tree
    assert a.cached_tokens == 0 and a.prefilled_tokens == 210
    assert b.cached_tokens == _floor(len(prefix)) == 192
    assert b.prefilled_tokens == 210 - 192
    assert eng.stats().prefilled_tokens == 210 + 18
    assert eng.stats().tree_pages == _distinct_pages(_computed([a, b]))
    assert_no_request_pages(eng)


def test_same_step_prefills_are_deduplicated_in_the_tree(tiny_models):
    eng = tiny_engine(tiny_models[("llama", False)], chunk_size=512)
    gen = torch.Generator().manual_seed(3)
    prefix = random_ids(gen, 200)
    a = eng.make_request(prefix + random_ids(gen, 10), greedy(3))
    b = eng.make_request(prefix + random_ids(gen, 10), greedy(3))
    for r in (a, b):
        eng.submit(r)
    eng.step()  # both prompts computed in the same forward: nothing to share yet
    s = eng.cache.check_integrity()
    assert a.cached_tokens == b.cached_tokens == 0
    # b's copy of the shared 12 pages went back to the free list at once; the tree holds one copy
    assert s.tree_pages == _distinct_pages([a.tokens[:209], b.tokens[:209]]) == 14
    assert a.pages[:12] == b.pages[:12]
    assert s.free_pages == s.total_pages - s.tree_pages - s.request_pages
    while eng.has_work():
        eng.step()
        eng.cache.check_integrity()
    assert eng.stats().tree_pages == _distinct_pages(_computed([a, b]))
    assert_no_request_pages(eng)


class _EvictSpy:
    """Wraps ``RadixCache.evict``: every page a live request holds must survive each eviction."""

    def __init__(self, eng: Engine) -> None:
        self.eng, self.tree = eng, eng.cache.prefix
        self.inner = self.tree.evict
        self.calls = self.calls_with_locked = self.freed = 0
        self.tree.evict = self

    def __call__(self, n_pages: int) -> int:
        cache = self.eng.cache
        held = {p for r in cache.live for p in r.pages}
        locked = {p for r in cache.live for p in r.pages[: r.num_tree_pages]}
        freed = self.inner(n_pages)
        assert not any(cache.allocator.is_free(p) for p in held), "evict freed a page a live request holds"
        self.calls += 1
        self.calls_with_locked += bool(locked)
        self.freed += freed
        return freed


def test_eviction_with_pool_smaller_than_working_set(tiny_models):
    d = tiny_models[("llama", False)]
    ps, rounds = 4, 2
    eng = tiny_engine(d, page_size=ps, num_pages=64, chunk_size=64, record_logits=True)  # ~3 conversations
    off = tiny_engine(d, prefix_cache="off", num_pages=512, record_logits=True)
    spy = _EvictSpy(eng)
    gen = torch.Generator().manual_seed(4)
    seqs = [random_ids(gen, 40 + 3 * i) for i in range(10)]

    def pages_stay_held(e: Engine, _outs) -> None:
        for r in e.scheduler.running:
            assert not any(e.cache.allocator.is_free(p) for p in r.pages)

    follow_up_hits = []
    for _ in range(rounds):
        for w in range(0, 10, 2):  # two conversations in flight, each taking two turns back to back
            for turn in range(2):
                prompts = seqs[w : w + 2]
                reqs = [eng.make_request(p, greedy(3)) for p in prompts]
                run_checked(eng, reqs, on_step=pages_stay_held)
                base = [off.make_request(p, greedy(3)) for p in prompts]
                run_checked(off, base)
                for r, b in zip(reqs, base):
                    assert r.output_ids == b.output_ids
                    assert_logits_close(r, b)
                if turn == 1:
                    follow_up_hits += [r.cached_tokens for r in reqs]
                for i, r in zip(range(w, w + 2), reqs):
                    seqs[i] = r.tokens + random_ids(gen, 9)
    working_set = sum(-(-len(s) // ps) for s in seqs)
    s = eng.stats()
    assert working_set > 3 * s.total_pages  # the pool really is too small for all conversations
    assert s.evicted_pages > 0 and spy.freed == s.evicted_pages
    assert spy.calls_with_locked > 0  # evictions happened while requests held tree pages
    assert all(follow_up_hits)  # a conversation's next turn still hits while it is hot
    assert_no_request_pages(eng)
    print(
        f"\neviction: evict calls={spy.calls} evicted_pages={s.evicted_pages} retractions={s.retractions} "
        f"cached={s.cached_tokens} prefilled={s.prefilled_tokens} working_set_pages={working_set} "
        f"follow_up_cached={follow_up_hits}"
    )


def test_running_requests_prefix_survives_eviction_when_least_recent(tiny_models):
    d = tiny_models[("llama", False)]
    ps = 4
    eng = tiny_engine(d, page_size=ps, num_pages=48, chunk_size=64)
    spy = _EvictSpy(eng)
    gen = torch.Generator().manual_seed(5)
    long_prompt = random_ids(gen, 24)
    long = eng.make_request(long_prompt, greedy(40))
    eng.submit(long)
    while len(long.output_ids) < 2:
        eng.step()
    assert long.num_tree_pages == 6  # its prompt is in the tree, locked, and now the oldest leaf
    shorts = []
    while long.finish_reason is None:  # short requests keep inserting fresher leaves that must be evicted
        req = eng.make_request(random_ids(gen, 24), greedy(2))
        shorts.append(req)
        eng.submit(req)
        while req.finish_reason is None and long.finish_reason is None:
            eng.step()
            eng.cache.check_integrity()
            assert not any(eng.cache.allocator.is_free(p) for p in long.pages)
    while eng.has_work():
        eng.step()
    s = eng.stats()
    assert s.evicted_pages > 0 and spy.calls_with_locked > 0
    assert 7 * len(shorts) > s.total_pages  # the shorts alone overflow the pool
    assert_no_request_pages(eng)
    eng.reset_prefix_cache()
    assert long.output_ids == eng.generate(long_prompt, greedy(40))[0].output_token_ids
