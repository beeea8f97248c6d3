"""The radix cache changes what is computed, never the result: cached runs equal ``prefix_cache="off"``.

Random conversation trees (new prompts, branches cut at page-misaligned points, exact repeats,
several requests in flight together) run on a radix engine, step by step with the page
integrity check after every step, and on the naive engine; every sampled row's logits must
agree within 1e-4 (fp32) and greedy outputs must be identical.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.engine import Engine
from runtime.request import Request
from tests.engine_drive import (
    assert_logits_close,
    assert_no_request_pages,
    greedy,
    random_ids,
    run_checked,
    tiny_engine,
)

PAGE_SIZES = (1, 4, 16)
SMALL_POOL_TOKENS = 96  # two long branches do not fit together: forces eviction and retraction
MAX_PROMPT = 90  # + 5 output tokens still fits the small pool alone
NEW_LENS = (1, 7, 16, 29, 45, 60)  # hypothesis favours tiny integers; these force multi-page prompts
TAIL_LENS = (0, 1, 5, 12, 20)


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
    return out


def _draw_prompt(
    data: st.DataObject, gen: torch.Generator, history: list[list[int]], prompts: list[list[int]]
) -> list[int]:
    kinds = ["new"] + (["branch", "branch", "repeat"] if history else [])
    kind = data.draw(st.sampled_from(kinds), label="kind")
    if kind == "new":
        return random_ids(gen, data.draw(st.sampled_from(NEW_LENS), label="new_len"))
    if kind == "repeat":
        return list(data.draw(st.sampled_from(prompts), label="repeated"))
    base = data.draw(st.sampled_from(history), label="parent")
    cut = data.draw(st.integers(0, len(base)), label="cut")
    tail = random_ids(gen, max(data.draw(st.sampled_from(TAIL_LENS), label="tail_len"), int(cut == 0)))
    return (base[:cut] + tail)[:MAX_PROMPT]


def _run(eng: Engine, prompts: list[list[int]], max_tokens: list[int]) -> list[Request]:
    reqs = [eng.make_request(p, greedy(m)) for p, m in zip(prompts, max_tokens)]
    run_checked(eng, reqs)
    return reqs


@pytest.mark.parametrize("ps", PAGE_SIZES)
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(data=st.data())
def test_radix_matches_off_on_random_conversation_trees(engines, ps, data):
    small = data.draw(st.booleans(), label="small_pool")
    eng, off = engines[(ps, small)], engines["off"]
    eng.reset_prefix_cache()
    off.reset_prefix_cache()
    assert eng.stats().tree_pages == 0
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="token_seed"))
    history: list[list[int]] = []  # full sequences (prompt + output) of finished requests
    prompts_so_far: list[list[int]] = []
    for _ in range(data.draw(st.integers(1, 3), label="waves")):
        n = data.draw(st.integers(1, 3), label="wave_size")
        prompts = [_draw_prompt(data, gen, history, prompts_so_far) for _ in range(n)]
        max_tokens = [data.draw(st.integers(1, 5), label="max_tokens") for _ in range(n)]
        cached = _run(eng, prompts, max_tokens)
        naive = _run(off, prompts, max_tokens)
        for a, b in zip(cached, naive):
            assert a.output_ids == b.output_ids
            assert_logits_close(a, b)
        history += [list(r.tokens) for r in cached]
        prompts_so_far += prompts
        assert_no_request_pages(eng)
    assert_no_request_pages(off)
