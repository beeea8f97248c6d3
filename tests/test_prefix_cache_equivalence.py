"""The radix cache changes what is computed, never the result: cached runs equal ``prefix_cache="off"``
on random conversation trees (``tests/conversation_trees.py``; the hybrid models run the same check in
``tests/test_hybrid_prefix_cache.py``)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conversation_trees import check_conversation_tree, tree_atol
from tests.engine_drive import tiny_engine

PAGE_SIZES = (1, 4, 16)
SMALL_POOL_TOKENS = 96  # two long branches do not fit together: forces eviction and retraction


@pytest.fixture(scope="module")
def engines(tiny_models) -> dict:
    """One radix engine per (page size, small pool) plus the naive baseline, reused across examples."""
    d = tiny_models[("llama", False)]
    out: dict = {"off": tiny_engine(d, prefix_cache="off", num_pages=1024, record_logits=True)}
    for ps in PAGE_SIZES:
        for small in (False, True):
            pages = SMALL_POOL_TOKENS // ps if small else 2048 // ps
            # chunk 24 is misaligned with every page size > 1, so chunk ends split pages too
            out[(ps, small)] = tiny_engine(
                d, page_size=ps, num_pages=pages, chunk_size=24, record_logits=True
            )
    out["atol"] = tree_atol(d)
    return out


@pytest.mark.parametrize("ps", PAGE_SIZES)
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(data=st.data())
def test_radix_matches_off_on_random_conversation_trees(engines, ps, data):
    small = data.draw(st.booleans(), label="small_pool")
    # dense: every request prefills only what follows its divergence from its page (slack 0)
    slack = None if small else 0
    check_conversation_tree(
        data, engines[(ps, small)], engines["off"], max_out=5, atol=engines["atol"], slack=slack
    )
