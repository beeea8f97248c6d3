"""Exact token accounting on an append-only agent conversation.

Turn k's prompt is turn k-1's prompt + its output + new tokens.  The ideal prefill of a turn is
its new tokens; on top of that the engine recomputes the previous turn's last output token
(sampled but never fed back, so it has no K/V) and, with pages of more than one token, loses
the partial last page of the previous turn.  Both extras are derived here from lengths alone,
never from the engine's counters.
"""

from __future__ import annotations

import pytest
import torch

from kvreuse.runtime.request import Request
from tests.engine_drive import assert_no_request_pages, greedy, random_ids, run_checked, tiny_engine

TURNS = 10
OUTPUT_TOKENS = 5


def _conversation(eng, seed: int) -> tuple[list[Request], list[int]]:
    """Run the 10 turns one after another; returns the requests and each turn's new-token count."""
    gen = torch.Generator().manual_seed(seed)
    prompt = random_ids(gen, 53)  # system prompt + tools + first user message
    reqs, new = [], [len(prompt)]
    for turn in range(TURNS):
        req = eng.make_request(prompt, greedy(OUTPUT_TOKENS))
        run_checked(eng, [req])
        reqs.append(req)
        assert len(req.output_ids) == OUTPUT_TOKENS
        if turn + 1 < TURNS:
            fresh = random_ids(gen, 7 + 11 * turn % 23)  # tool results of varied, misaligned sizes
            new.append(len(fresh))
            prompt = list(req.tokens) + fresh
    return reqs, new


def _check_totals(eng, reqs: list[Request]) -> None:
    s = eng.stats()
    assert s.requests == len(reqs)
    assert s.prompt_tokens == sum(r.num_prompt for r in reqs)
    assert s.cached_tokens == sum(r.cached_tokens for r in reqs)
    assert s.prefilled_tokens == sum(r.prefilled_tokens for r in reqs)
    assert s.generated_tokens == sum(len(r.output_ids) for r in reqs)
    assert s.retractions == 0


@pytest.mark.parametrize("page_size", [1, 16])
def test_append_only_conversation_prefills_only_new_tokens(tiny_models, page_size):
    eng = tiny_engine(
        tiny_models[("llama", False)], page_size=page_size, num_pages=4096 // page_size, chunk_size=64
    )
    reqs, new = _conversation(eng, seed=page_size)
    losses = []
    for k, (req, n_new) in enumerate(zip(reqs, new)):
        assert req.cached_tokens + req.prefilled_tokens == req.num_prompt, f"turn {k}"
        if k == 0:
            assert (req.cached_tokens, req.prefilled_tokens) == (0, req.num_prompt)
            continue
        prev_len = len(reqs[k - 1].tokens)
        assert req.num_prompt == prev_len + n_new
        recompute = 1  # the previous turn's last output token was sampled, never computed
        computed_before = prev_len - recompute
        loss = computed_before % page_size  # tokens of the previous turn's partial last page
        losses.append(loss)
        assert req.prefilled_tokens == n_new + recompute + loss, f"turn {k}"
        assert req.cached_tokens == computed_before - loss, f"turn {k}"
    if page_size == 1:
        assert not any(losses)
    else:
        assert sum(losses) > 0  # the lengths are chosen misaligned, so the page loss is real
    _check_totals(eng, reqs)
    assert_no_request_pages(eng)
    ideal = sum(new)
    s = eng.stats()
    print(f"\npage_size={page_size}: prompt={s.prompt_tokens} ideal={ideal} prefilled={s.prefilled_tokens} "
          f"recompute={TURNS - 1} page_loss={sum(losses)} per_turn={losses}")  # fmt: skip


def test_off_prefills_everything(tiny_models):
    eng = tiny_engine(tiny_models[("llama", False)], prefix_cache="off", num_pages=512)
    reqs, _ = _conversation(eng, seed=3)
    for req in reqs:
        assert (req.cached_tokens, req.prefilled_tokens) == (0, req.num_prompt)
    _check_totals(eng, reqs)
    assert eng.stats().tree_pages == 0
    assert_no_request_pages(eng)
