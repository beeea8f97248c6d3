"""Schedule policies: ``lpm`` admits the waiting request with the longest cached prefix first, ``fcfs``
admits in arrival order; with one running slot the two give different admission orders."""

from __future__ import annotations

import pytest
import torch

from tests.engine_drive import greedy, random_ids, run_checked, tiny_engine


def _admission_order(model_dir, policy: str) -> tuple[list[str], dict[str, int]]:
    eng = tiny_engine(model_dir, page_size=16, num_pages=128, max_running=1, schedule_policy=policy)
    g = torch.Generator().manual_seed(3)
    shared = random_ids(g, 64)
    eng.generate(shared + random_ids(g, 5), greedy(1))  # the tree now holds shared's 4 whole pages
    reqs = {
        "cold1": eng.make_request(random_ids(g, 40), greedy(2)),
        "cold2": eng.make_request(random_ids(g, 40), greedy(2)),
        "warm": eng.make_request(shared + random_ids(g, 7), greedy(2)),  # arrives last
    }
    run_checked(eng, list(reqs.values()))
    order = sorted(reqs, key=lambda n: reqs[n].admitted_time)
    return order, {n: r.cached_tokens for n, r in reqs.items()}


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_policy_decides_admission_order(tiny_models, policy):
    order, cached = _admission_order(tiny_models[("llama", False)], policy)
    # the shared prefix is 64 tokens = 4 pages; nothing else was ever computed
    assert cached == {"cold1": 0, "cold2": 0, "warm": 64}
    if policy == "fcfs":
        assert order == ["cold1", "cold2", "warm"]
    else:  # the warm request jumps the queue; the cold ones keep their arrival order (stable sort)
        assert order == ["warm", "cold1", "cold2"]


def test_unknown_policy_is_rejected(tiny_models):
    with pytest.raises(ValueError, match="schedule policy"):
        tiny_engine(tiny_models[("llama", False)], schedule_policy="sjf")
