"""Session pins through the engine: TTL, refresh on use, the page budget, pressure, integrity.

Every expectation is derived from lengths (whole pages of a session's history), never read back
from the engine's own counters; ``run_checked`` checks page integrity (pins included) each step.
"""

from __future__ import annotations

import pytest
import torch

from kvreuse.runtime.request import CacheScope, Request
from tests.engine_drive import greedy, random_ids, run_checked, tiny_engine

PAGE, POOL = 16, 64  # 1024 tokens of KV; pins may hold 32 pages


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _engine(model, policy="lru", ttl=300.0):
    eng = tiny_engine(model, page_size=PAGE, num_pages=POOL, chunk_size=128, eviction_policy=policy,
                      session_ttl=ttl)  # fmt: skip
    clock = Clock()
    eng.cache.pins.clock = clock
    return eng, clock


def _run(eng, prompt: list[int], session=None, out: int = 4) -> Request:
    req = eng.make_request(prompt, greedy(out))
    req.scope = CacheScope(session=session)
    run_checked(eng, [req])
    return req


def _scan(eng, gen, n: int = 6) -> None:
    """One-off requests that together need more than the whole pool."""
    for _ in range(n):
        _run(eng, random_ids(gen, 300))


def _reusable(req: Request) -> int:
    """Tokens of ``req``'s history a next turn can reuse: whole pages of prompt + output[:-1]."""
    return (len(req.tokens) - 1) // PAGE * PAGE


def _idle_then_scan(model, policy: str, session) -> tuple[int, int]:
    """A session, a 299 s idle (TTL 300) with a scan, then its next turn: (cached, reusable) tokens."""
    eng, clock = _engine(model, policy)
    gen = torch.Generator().manual_seed(1)
    first = _run(eng, random_ids(gen, 200), session=session)
    clock.t += 299.0
    _scan(eng, gen)
    nxt = _run(eng, list(first.tokens) + random_ids(gen, 16), session=session)
    return nxt.cached_tokens, _reusable(first)


@pytest.mark.parametrize("policy", ["lru", "reuse"])
def test_session_idle_below_ttl_survives_a_scan_that_evicts_it_under_lru(tiny_models, policy):
    model = tiny_models[("llama", False)]
    unpinned, reusable = _idle_then_scan(model, "lru", None)
    assert unpinned < reusable // 2  # without a pin, LRU loses the history to the scan
    cached, reusable = _idle_then_scan(model, policy, "A")
    assert cached == reusable > 0  # pinned: the whole history survived


def test_pin_lapses_after_ttl(tiny_models):
    eng, clock = _engine(tiny_models[("llama", False)])
    gen = torch.Generator().manual_seed(2)
    first = _run(eng, random_ids(gen, 200), session="A")
    clock.t += 301.0
    _scan(eng, gen)
    assert "A" not in eng.cache.pins and eng.cache.pins.lapsed["ttl"] == 1
    nxt = _run(eng, list(first.tokens) + random_ids(gen, 16), session="A")
    assert nxt.cached_tokens < _reusable(first) // 2


def test_over_budget_the_least_recently_used_pin_lapses_first(tiny_models):
    eng, clock = _engine(tiny_models[("llama", False)])
    gen = torch.Generator().manual_seed(3)
    pins = eng.cache.pins
    assert pins.budget == POOL // 2
    reqs = {}
    for name in ("A", "B"):
        reqs[name] = _run(eng, random_ids(gen, 200), session=name)  # 13 pages each
        clock.t += 1
    # A comes back: its pin is refreshed and moves forward, so B is now the oldest
    reqs["A"] = _run(eng, list(reqs["A"].tokens) + random_ids(gen, 8), session="A")
    clock.t += 1
    assert [p.owner for p in pins.info()] == ["B", "A"]
    assert pins.info()[1].ttl_left == pytest.approx(299.0)
    reqs["C"] = _run(eng, random_ids(gen, 200), session="C")  # 13 + 14 + 13 pages > 32
    assert [p.owner for p in pins.info()] == ["A", "C"] and pins.lapsed["budget"] == 1
    assert eng.cache.stats().pinned_pages == sum(-(-_reusable(reqs[k]) // PAGE) for k in "AC")
    assert eng.cache.stats().pinned_pages <= pins.budget


def test_pins_lapse_under_pressure_rather_than_starve_admission(tiny_models):
    eng, _ = _engine(tiny_models[("llama", False)])
    gen = torch.Generator().manual_seed(4)
    _run(eng, random_ids(gen, 240), session="A")
    _run(eng, random_ids(gen, 240), session="B")  # 30 pinned pages of 64
    big = _run(eng, random_ids(gen, 700), out=8)  # needs 44 pages: one pin must go
    assert len(big.output_ids) == 8 and big.retractions == 0
    assert eng.cache.pins.lapsed["pressure"] >= 1 and [p.owner for p in eng.cache.pins.info()] in ([], ["B"])


def test_pinned_pages_are_part_of_the_integrity_check(tiny_models):
    eng, _ = _engine(tiny_models[("llama", False)])
    gen = torch.Generator().manual_seed(5)
    req = _run(eng, random_ids(gen, 100), session="A")
    tree = eng.cache.prefix
    assert eng.cache.check_integrity().pinned_pages == (len(req.tokens) - 1) // PAGE
    stray = tree.match(req.tokens[:32]).handle
    tree.pin(stray)  # a pin the table does not know about (inside A's path: same pinned pages)
    with pytest.raises(AssertionError, match="pinned pages"):
        eng.cache.check_integrity()
    tree.unpin(stray)
    eng.cache.check_integrity()
    eng.reset_prefix_cache()  # pins are dropped with the tree
    assert len(eng.cache.pins) == 0 and eng.cache.check_integrity().tree_pages == 0


def _tenant_run(eng, prompt: list[int], tenant: str, session: str) -> Request:
    req = eng.make_request(prompt, greedy(4))
    req.scope = CacheScope(tenant, 0, (tenant, session))
    run_checked(eng, [req])
    return req


def test_a_tenant_flooding_sessions_lapses_its_own_pins_not_anothers(tiny_models):
    """Issue 39: B's sessions must not push A's pin out (the old order lapsed the globally oldest: A's)."""
    eng, clock = _engine(tiny_models[("llama", False)])
    gen = torch.Generator().manual_seed(5)
    a = _tenant_run(eng, random_ids(gen, 200), "A", "a1")  # 13 pages, the oldest pin
    for i in range(4):  # 4 x 13 pages of B's: over the 32-page budget twice
        clock.t += 1
        _tenant_run(eng, random_ids(gen, 200), "B", f"b{i}")
    pins = eng.cache.pins
    assert ("A", "a1") in pins  # A's pin survived B's flood
    assert pins.lapsed_by["B"]["budget"] >= 2 and not pins.lapsed_by["A"]
    nxt = _tenant_run(eng, list(a.tokens) + random_ids(gen, 8), "A", "a1")
    assert nxt.cached_tokens == _reusable(a)


def test_a_tenant_holds_at_most_its_pin_count(tiny_models):
    eng, clock = _engine(tiny_models[("llama", False)])
    eng.cache.pins.per_tenant = 2
    gen = torch.Generator().manual_seed(6)
    for i in range(3):
        clock.t += 1
        _tenant_run(eng, random_ids(gen, 40), "B", f"b{i}")
    assert [p.owner for p in eng.cache.pins.info()] == [("B", "b1"), ("B", "b2")]


def _tenant_req(eng, prompt: list[int], tenant: str, session: str, out: int = 4) -> Request:
    req = eng.make_request(prompt, greedy(out))
    req.scope = CacheScope(tenant, 0, (tenant, session))
    return req


def test_a_pin_within_its_tenants_share_survives_anothers_load(tiny_models):
    """Issue 51 row 4: B's concurrent sessions need more than the pool; A's one pin (15 of the 32-page
    budget, within half of it) used to lapse as "pressure" once B had none left to lose."""
    eng, clock = _engine(tiny_models[("llama", False)])
    gen = torch.Generator().manual_seed(51)
    a = _tenant_run(eng, random_ids(gen, 240), "A", "a1")  # 15 pages pinned
    for round_ in range(3):  # B's flood: 4 sessions of 300 tokens at once (4 x 19 pages > the 64-page pool)
        clock.t += 1
        reqs = [_tenant_req(eng, random_ids(gen, 300), "B", f"b{round_}-{i}", out=8) for i in range(4)]
        run_checked(eng, reqs)
    pins = eng.cache.pins
    assert ("A", "a1") in pins and not pins.lapsed_by["A"], dict(pins.lapsed_by)
    nxt = _tenant_run(eng, list(a.tokens) + random_ids(gen, 8), "A", "a1")
    assert nxt.cached_tokens == _reusable(a) == 240


def test_over_budget_the_tenant_over_its_share_lapses_not_the_one_within(tiny_models):
    """Two tenants share a 32-page budget (16 pages each): C's 5 pages are within its share and never
    lapse to B's pins; B, over its share, loses its own."""
    eng, clock = _engine(tiny_models[("llama", False)])
    gen = torch.Generator().manual_seed(52)
    _tenant_run(eng, random_ids(gen, 80), "C", "c1")  # 5 pages, the oldest pin
    for i in range(6):  # B: 6 x 5 pages, over its share and, with C, over the budget
        clock.t += 1
        _tenant_run(eng, random_ids(gen, 80), "B", f"b{i}")
    pins = eng.cache.pins
    assert ("C", "c1") in pins and not pins.lapsed_by["C"]
    assert pins.lapsed_by["B"]["budget"] >= 1
