"""Speculative decoding in the engine: greedy output identical to decoding without it (fp32, token for
token, alone and in mixed batches with chunked prefill alongside), pages checked after every step,
stops inside an accepted draft, logprobs, grammar rows, cancellation, tenants (hybrids:
tests/test_speculative_hybrid.py)."""

from __future__ import annotations

import pytest
import torch

from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.request import CacheScope
from kvreuse.runtime.sampling.params import SamplingParams
from tests.engine_drive import assert_no_request_pages, greedy, random_ids, run_checked, tiny_engine
from tests.helpers import make_tiny_hybrid, make_tiny_windowed


def _repetitive_prompts(seed: int, n: int) -> list[list[int]]:
    """Prompts that repeat part of themselves (as agents re-read files and tool calls), of mixed lengths."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        base = random_ids(gen, 12 + 9 * i)
        out.append(base + random_ids(gen, 3 + i) + base[: 6 + 2 * i])
    return out


def _outputs(eng: Engine, prompts: list[list[int]], params: list[SamplingParams]):
    reqs = [eng.make_request(p, sp) for p, sp in zip(prompts, params)]
    run_checked(eng, reqs)  # check_integrity after every step
    assert_no_request_pages(eng)
    return reqs


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("mode", ["ngram", "suffix"])
def test_greedy_output_identical_with_and_without_speculation(tiny_models, arch, mode):
    d = tiny_models[(arch, arch == "qwen3")]
    prompts = _repetitive_prompts(1, 7)
    params = [greedy(24 + 5 * i) for i in range(7)]
    ref = _outputs(tiny_engine(d, chunk_size=40), prompts, params)
    spec = tiny_engine(d, chunk_size=40, speculative=mode)  # small chunks: prefill runs beside drafts
    batch = _outputs(spec, prompts, params)
    assert [r.output_ids for r in batch] == [r.output_ids for r in ref]
    assert sum(r.accepted_tokens for r in batch) > 0, "nothing was accepted: the test proves nothing"
    alone = [_outputs(spec, [p], [sp])[0] for p, sp in zip(prompts[:3], params[:3])]  # batch of one
    assert [r.output_ids for r in alone] == [r.output_ids for r in ref[:3]]


def test_scripted_repetition_is_verified_many_tokens_a_step_and_cached_exactly(tiny_models):
    d = tiny_models[("llama", False)]
    gen = torch.Generator().manual_seed(5)
    text = random_ids(gen, 90)
    prompt = random_ids(gen, 20) + text + random_ids(gen, 7)
    reply = text[:40] + random_ids(gen, 3) + text[43:80]  # a copy with one edit, forced
    sp = SamplingParams(max_tokens=len(reply) + 6, forced_tokens=reply, ignore_eos=True)
    off, on = tiny_engine(d), tiny_engine(d, speculative="ngram")
    r_off, r_on = _outputs(off, [prompt], [sp])[0], _outputs(on, [prompt], [sp])[0]
    assert r_on.output_ids == r_off.output_ids and r_on.output_ids[: len(reply)] == reply
    steps = len(r_on.output_ids) - r_on.accepted_tokens
    assert len(r_on.output_ids) / steps > 3, (r_on.drafted_tokens, r_on.accepted_tokens)
    # nothing rejected entered the tree: the next turn hits the same pages and continues the same way
    nxt = prompt + r_on.output_ids + random_ids(gen, 5)
    a, b = off.generate([nxt], greedy(12))[0], on.generate([nxt], greedy(12))[0]
    assert a.cached_tokens == b.cached_tokens > len(prompt)
    assert a.output_token_ids == b.output_token_ids


def test_stop_token_and_stop_string_inside_an_accepted_draft(tiny_models):
    d = tiny_models[("llama", False)]
    gen = torch.Generator().manual_seed(7)
    text = random_ids(gen, 60)
    prompt = text + random_ids(gen, 5) + text[:4]
    reply = text[4:50]
    stop_tok = reply[30]
    params = [
        SamplingParams(max_tokens=48, forced_tokens=reply, ignore_eos=True, stop_token_ids=[stop_tok]),
        SamplingParams(max_tokens=len(reply), forced_tokens=reply, ignore_eos=True),  # length mid-draft
        SamplingParams(max_tokens=48, forced_tokens=reply, ignore_eos=True, logprobs=2),
    ]
    off, on = tiny_engine(d), tiny_engine(d, speculative="ngram")
    for sp in params:
        a, b = _outputs(off, [prompt], [sp])[0], _outputs(on, [prompt], [sp])[0]
        assert b.output_ids == a.output_ids and b.finish_reason == a.finish_reason
        assert b.accepted_tokens > 0
        if sp.logprobs is not None:
            assert [t for t, _ in b.logprobs] == [t for t, _ in a.logprobs]
            for (_, x), (_, y) in zip(a.logprobs, b.logprobs):
                assert x[0] == pytest.approx(y[0], abs=1e-4)
                assert [t for t, _ in x[1]] == [t for t, _ in y[1]]
    assert a.output_ids.index(stop_tok) < len(reply)  # the stop really fell inside the forced text
    # a stop string: the text ends where it does without speculation
    detok = on.tokenizer.decode(reply[20:23])
    sp = SamplingParams(max_tokens=48, forced_tokens=reply, ignore_eos=True, stop=[detok])
    a, b = off.generate([prompt], sp)[0], on.generate([prompt], sp)[0]
    assert (b.text, b.finish_reason, b.output_token_ids) == (a.text, a.finish_reason, a.output_token_ids)


def test_cancelled_while_speculating_frees_every_page(tiny_models):
    d = tiny_models[("llama", False)]
    gen = torch.Generator().manual_seed(9)
    text = random_ids(gen, 80)
    eng = tiny_engine(d, speculative="ngram")
    reqs = [
        eng.make_request(
            text + text[:3], SamplingParams(max_tokens=70, forced_tokens=text[3:73], ignore_eos=True)
        )
        for _ in range(3)
    ]

    def abort_second(e: Engine, outs) -> None:
        if reqs[1].accepted_tokens > 0 and reqs[1].finish_reason is None:
            e.abort(reqs[1].request_id)

    run_checked(eng, reqs, on_step=abort_second)
    assert reqs[1].finish_reason == "abort"
    assert reqs[0].output_ids == text[3:73]
    assert_no_request_pages(eng)


def test_suffix_drafts_from_the_same_tenant_only(tiny_models):
    d = tiny_models[("llama", False)]
    gen = torch.Generator().manual_seed(11)
    reply = random_ids(gen, 50)
    eng = tiny_engine(d, speculative="suffix")
    sp = SamplingParams(max_tokens=50, forced_tokens=reply, ignore_eos=True)
    first = eng.make_request(random_ids(gen, 10), sp, scope=CacheScope("a"))
    run_checked(eng, [first])
    # another prompt, no repetition inside it; only the earlier request's reply can predict this one
    ask = random_ids(gen, 9) + reply[:4]
    cont = SamplingParams(max_tokens=40, forced_tokens=reply[4:44], ignore_eos=True)
    other, same = (
        eng.make_request(ask, cont, scope=CacheScope("b")),
        eng.make_request(ask, cont, scope=CacheScope("a")),
    )
    run_checked(eng, [other])
    run_checked(eng, [same])
    assert other.accepted_tokens == 0
    assert same.accepted_tokens >= 30
    assert other.output_ids == same.output_ids == reply[4:44]


def test_unknown_mode_is_a_clear_error(tiny_models):
    with pytest.raises(ValueError, match="speculative must be one of off, ngram, suffix"):
        tiny_engine(tiny_models[("llama", False)], speculative="eagle")


def test_tensor_parallel_ranks_verify_the_same_drafts(tiny_models):
    d = tiny_models[("llama", False)]
    prompts = _repetitive_prompts(3, 3)
    params = [greedy(30) for _ in prompts]
    ref = _outputs(tiny_engine(d), prompts, params)
    two = tiny_engine(d, tensor_parallel_size=2, speculative="ngram")
    try:
        got = _outputs(two, prompts, params)
    finally:
        two.close()
    assert [r.output_ids for r in got] == [r.output_ids for r in ref]
    assert sum(r.accepted_tokens for r in got) > 0


def test_auto_drafts_from_the_suffix_history_where_the_model_allows(tiny_models, tmp_path):
    """``auto`` (``kvreuse serve``'s default) is ``suffix`` on a dense model and on a hybrid (which rolls
    a rejected draft's state back), ``off`` on a window-paged model instead of refusing to start."""
    import argparse

    from kvreuse.kernels.native_cpu import load as load_native
    from kvreuse.runtime.engine.args import add_engine_args
    from kvreuse.runtime.speculative.drafter import NoDrafts, SuffixLookup

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert parser.parse_args([]).speculative == "auto"
    dense = tiny_engine(tiny_models[("llama", False)], speculative="auto")
    assert isinstance(dense.scheduler.drafter, SuffixLookup)
    prompts = _repetitive_prompts(5, 3)
    reqs = _outputs(dense, prompts, [greedy(12)] * 3)
    assert sum(r.accepted_tokens for r in reqs) > 0
    hybrid = tiny_engine(make_tiny_hybrid(tmp_path / "hy", "gqa-3to1-untied"), speculative="auto")
    assert isinstance(hybrid.scheduler.drafter, SuffixLookup)
    windowed = tiny_engine(make_tiny_windowed(tmp_path / "w", "gemma3-odd"), speculative="auto")
    assert isinstance(windowed.scheduler.drafter, NoDrafts)
    # int4 verifies a draft through the row-block kernel (q4_linear.c); torch's int8 kernel costs a row each
    d = tiny_models[("llama", False)]
    int4 = tiny_engine(d, speculative="auto", quantize="int4")
    assert isinstance(int4.scheduler.drafter, SuffixLookup if load_native() is not None else NoDrafts)
    assert isinstance(tiny_engine(d, speculative="auto", quantize="int8").scheduler.drafter, NoDrafts)
