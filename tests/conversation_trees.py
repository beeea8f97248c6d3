"""Random conversation trees for the cache-equivalence tests (dense and hybrid): cached == cache off.

New prompts, branches cut at page-misaligned points and exact repeats, several requests in flight
together, run step by step with the integrity check after every step on the cached engine and on the
naive one; outputs must be identical and every sampled row's logits within ``tree_atol`` (fp32).
"""

from __future__ import annotations

import copy

import torch
from hypothesis import strategies as st

from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.request import Request
from tests.engine_drive import assert_logits_close, assert_no_request_pages, greedy, random_ids, run_checked
from tests.helpers import load_hf

MAX_PROMPT = 90  # + the outputs still fits a 96-token pool alone
NEW_LENS = (1, 7, 16, 29, 45, 60)  # hypothesis favours tiny integers; these force multi-page prompts
TAIL_LENS = (0, 1, 5, 12, 20)


def draw_prompt(
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


def tree_atol(model_dir, prompts: int = 12) -> float:
    """How far cache on and cache off may differ on this model: twice transformers' own fp32 error
    (its fp32 logits against its float64 ones, worst over ``prompts`` random prompts of 8-90 tokens),
    and never under 1e-4.  Each engine's rows are one fp32 summation order, so each is about that far
    from exact and the two at most twice as far from each other.  Why not a fixed 1e-4: on
    gemma4-odd transformers' fp32 lands 2e-4 from float64 (gemma3-odd 4e-6), and the naive engine
    alone moves a row by 1.5e-4 between chunk sizes, so a clean-clone run failed one tree at 1.07e-4."""
    hf = load_hf(model_dir)
    exact = copy.deepcopy(hf).double()  # the same weights, read once
    gen = torch.Generator().manual_seed(7)
    worst = 0.0
    with torch.no_grad():
        for _ in range(prompts):
            ids = torch.tensor([random_ids(gen, int(torch.randint(8, MAX_PROMPT, (1,), generator=gen)))])
            worst = max(worst, (hf(ids).logits[0].double() - exact(ids).logits[0]).abs().max().item())
    return max(1e-4, 2 * worst)


def run_all(eng: Engine, prompts: list[list[int]], max_tokens: list[int]) -> list[Request]:
    reqs = [eng.make_request(p, greedy(m)) for p, m in zip(prompts, max_tokens)]
    run_checked(eng, reqs)
    return reqs


def reuse_excess(prompt: list[int], prefilled: int, history: list[list[int]], page_size: int) -> int:
    """Tokens prefilled beyond the ideal: the prompt after the longest prefix it shares with an earlier
    request's computed sequence (its tokens but the last sampled one), rounded down to a page, and
    never all of it (one token is computed for the logits).  Independent of the cache's own figures."""
    shared = 0
    for seq in history:
        n = min(len(seq) - 1, len(prompt) - 1)
        shared = max(shared, next((i for i in range(n) if seq[i] != prompt[i]), n))
    return prefilled - (len(prompt) - shared // page_size * page_size)


def check_conversation_tree(
    data: st.DataObject, eng: Engine, off: Engine, max_out: int, atol: float, slack: int | None = None
) -> int:
    """One random tree of 1-3 waves of 1-3 requests (1..``max_out`` tokens each) on both engines;
    sampled rows within ``atol`` (``tree_atol`` of the model).  ``slack`` (a pool that never evicts):
    every request prefills at most ``slack`` tokens beyond the ideal (``reuse_excess``: the tokens
    after its divergence from every earlier wave's sequences, from its page).  Returns the worst excess."""
    eng.reset_prefix_cache()
    off.reset_prefix_cache()
    assert eng.stats().tree_pages == 0
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="token_seed"))
    history: list[list[int]] = []  # full sequences (prompt + output) of finished requests
    worst = 0
    prompts_so_far: list[list[int]] = []
    for _ in range(data.draw(st.integers(1, 3), label="waves")):
        n = data.draw(st.integers(1, 3), label="wave_size")
        prompts = [draw_prompt(data, gen, history, prompts_so_far) for _ in range(n)]
        max_tokens = [data.draw(st.integers(1, max_out), label="max_tokens") for _ in range(n)]
        cached, naive = run_all(eng, prompts, max_tokens), run_all(off, prompts, max_tokens)
        for a, b in zip(cached, naive):
            assert a.output_ids == b.output_ids
            assert_logits_close(a, b, atol)
            excess = reuse_excess(a.prompt_ids, a.prefilled_tokens, history, eng.cache.page_size)
            worst = max(worst, excess)
            assert slack is None or excess <= slack, (excess, slack, a.cached_tokens, a.prefilled_tokens)
        history += [list(r.tokens) for r in cached]
        prompts_so_far += prompts
        assert_no_request_pages(eng)
    assert_no_request_pages(off)
    return worst
