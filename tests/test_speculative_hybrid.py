"""Speculative decoding on hybrid models (Gated DeltaNet + full attention): a rejected draft rolls the
linear-attention state back, so greedy output is identical to decoding without speculation (fp32,
token for token, logprobs within 1e-4) alone and in batches with plain decodes and chunked prefill
beside the drafts; integrity (pages, state slots, snapshots) holds after every step; the snapshot a
speculating request leaves is at an accepted position (the next turn's cache hit computes what a
cold engine computes); sampling keeps its distribution; window-paged models are still refused."""

from __future__ import annotations

import pytest
import torch

from kvreuse.runtime.cache import state_slots
from kvreuse.runtime.engine.engine import Engine, EngineError
from kvreuse.runtime.models.gated_deltanet import replay
from kvreuse.runtime.request import PUBLIC
from kvreuse.runtime.sampling.params import SamplingParams
from tests.engine_drive import assert_no_request_pages, random_ids, run_checked, tiny_engine
from tests.helpers import make_tiny_hybrid, make_tiny_windowed
from tests.test_speculative_sampling import two_sample_pvalue

SHAPES = {"gqa-3to1-untied": 4, "odd-heads-1to1-tied": 16}  # shape -> page size


@pytest.fixture(scope="module")
def hybrids(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("spec_hybrid")
    return {s: make_tiny_hybrid(root / s, s) for s in SHAPES}


def _copying(seed: int, n: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompts whose reply starts by copying part of the prompt with one edit (forced, as an agent
    re-emits a file or a tool call: drafts accepted up to the edit, rejected there), then continues
    freely (the state rolled back decides those tokens); every third without copying (its decodes run
    beside the drafting rows).  Logprobs on, so every row's distribution is compared."""
    gen = torch.Generator().manual_seed(seed)
    prompts, params = [], []
    for i in range(n):
        text = random_ids(gen, 30 + 7 * i)
        prompts.append(random_ids(gen, 5 + i) + text + random_ids(gen, 4) + text[:4])
        e = 12 + i  # the edit: inside a draft of 8 (the drafter's second, after the first 6 tokens)
        reply = text[4:e] + random_ids(gen, 1) + text[e + 1 :] if i % 3 != 2 else []
        params.append(SamplingParams(max_tokens=len(reply) + 12 + i, forced_tokens=reply, ignore_eos=True,
                                     logprobs=1))  # fmt: skip
    return prompts, params


def _run(eng: Engine, prompts: list[list[int]], params: list[SamplingParams]):
    reqs = [eng.make_request(p, sp) for p, sp in zip(prompts, params)]
    run_checked(eng, reqs)  # check_integrity after every step: pages, state slots, snapshots
    assert_no_request_pages(eng)
    return reqs


def _record_batches(eng: Engine) -> list[set[str]]:
    """Per step, the kinds of chunk it ran: ``draft``, ``decode`` (one token, no draft), ``prefill``."""
    kinds: list[set[str]] = []
    schedule = eng.scheduler.schedule

    def traced():
        batch = schedule()
        if batch is not None:
            kinds.append(
                {
                    "draft" if c.draft else "decode" if c.sample and c.length == 1 else "prefill"
                    for c in batch.chunks
                }
            )
        return batch

    eng.scheduler.schedule = traced
    return kinds


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["ngram", "suffix"])
def test_greedy_output_identical_with_and_without_speculation(hybrids, shape, mode):
    d, ps = hybrids[shape], SHAPES[shape]
    prompts, params = _copying(1, 7)
    ref = _run(tiny_engine(d, chunk_size=40, page_size=ps), prompts, params)
    spec = tiny_engine(d, chunk_size=40, page_size=ps, speculative=mode)  # prefill runs beside drafts
    kinds = _record_batches(spec)
    got = _run(spec, prompts, params)
    assert [r.output_ids for r in got] == [r.output_ids for r in ref]
    for a, b in zip(ref, got):
        for (_, x), (_, y) in zip(a.logprobs, b.logprobs):
            assert x[0] == pytest.approx(y[0], abs=1e-4)
            assert [t for t, _ in x[1]] == [t for t, _ in y[1]]
    drafted, accepted = sum(r.drafted_tokens for r in got), sum(r.accepted_tokens for r in got)
    assert 0 < accepted < drafted, "drafts must be both accepted and rejected, or the test proves nothing"
    assert any(k == {"draft", "decode", "prefill"} for k in kinds), "no step mixed the three kinds"
    alone = [_run(spec, [p], [sp])[0] for p, sp in zip(prompts[:3], params[:3])]  # batch of one
    assert [r.output_ids for r in alone] == [r.output_ids for r in ref[:3]]
    assert sum(r.drafted_tokens - r.accepted_tokens for r in alone) > 0


def test_snapshots_left_by_speculation_equal_plain_decodes_and_serve_the_next_turn(hybrids, monkeypatch):
    """Page size 4: verify chunks cross page boundaries, so the decode snapshot a request leaves is often
    rebuilt inside an accepted draft.  Each one equals what plain decoding left (same position, same
    state), and the next turn's cache hit computes what a cache-less engine computes, speculation after
    the hit still giving the plain engine's tokens."""
    inside: list[int] = []  # snapshot offsets inside accepted drafts (the replay's cuts)

    def spy(inp, which, lengths, cuts):
        inside.extend(c for cs in cuts for c in cs)
        return replay(inp, which, lengths, cuts)

    monkeypatch.setattr(state_slots, "replay", spy)
    d = hybrids["gqa-3to1-untied"]
    off, on = (
        tiny_engine(d, page_size=4),
        tiny_engine(d, page_size=4, speculative="ngram", record_logits=True),
    )
    prompts, params = _copying(4, 5)
    for i in (0, 1, 3, 4):  # requests that end inside a copied run, after a rejection at the edit
        reply = params[i].forced_tokens
        sp = SamplingParams(max_tokens=len(reply), forced_tokens=reply, ignore_eos=True)
        a, b = _run(off, [prompts[i]], [sp])[0], _run(on, [prompts[i]], [sp])[0]
        assert a.output_ids == b.output_ids and 0 < b.accepted_tokens < b.drafted_tokens
        ma, mb = (e.cache.prefix.match(prompts[i] + reply, PUBLIC) for e in (off, on))
        assert mb.cached_len == ma.cached_len > len(prompts[i]) and mb.state is not None
        assert (ma.state.rec - mb.state.rec).abs().max().item() <= 1e-5
        assert (ma.state.conv - mb.state.conv).abs().max().item() <= 1e-5
    assert inside, "no snapshot was rebuilt inside an accepted draft: the test proves less than it says"
    cold = tiny_engine(d, page_size=4, prefix_cache="off", record_logits=True)
    gen = torch.Generator().manual_seed(8)
    prompt = prompts[1]
    nxt = prompt + params[1].forced_tokens + random_ids(gen, 5) + prompt[5:9]
    second = SamplingParams(max_tokens=40, forced_tokens=prompt[9:35], ignore_eos=True)
    a2, b2, c2 = (_run(e, [nxt], [second])[0] for e in (off, on, cold))
    assert b2.cached_tokens == a2.cached_tokens > len(prompt)
    assert (b2.logits_trace[0] - c2.logits_trace[0]).abs().max().item() <= 1e-4
    assert a2.output_ids == b2.output_ids == c2.output_ids
    assert b2.accepted_tokens > 0


def test_temperature_sampling_distribution_unchanged(hybrids):
    """The next two tokens after a forced one, sampled with and without speculation (the n-gram draft is
    what followed earlier in the prompt): the same distribution (chi-square homogeneity)."""
    d = hybrids["gqa-3to1-untied"]
    gen = torch.Generator().manual_seed(2)
    a, x, y, z = random_ids(gen, 4)
    prompt = random_ids(gen, 12) + [a, x, y, z] + random_ids(gen, 8) + [a]
    n = 400
    kw = dict(max_tokens=3, temperature=1.0, top_k=5, forced_tokens=[x], ignore_eos=True,
              logit_bias={y: 3.0, z: 3.0})  # fmt: skip
    counts, accepted, rejected = [], 0, 0
    for mode in ("off", "ngram"):
        eng = tiny_engine(d, speculative=mode, max_running=n, num_pages=1024)
        outs = _run(eng, [prompt] * n, [SamplingParams(**kw, seed=s) for s in range(n)])
        c: dict = {}
        for o in outs:
            c[tuple(o.output_ids[1:])] = c.get(tuple(o.output_ids[1:]), 0) + 1
        counts.append(c)
        accepted += sum(o.accepted_tokens for o in outs)
        rejected += sum(o.drafted_tokens - o.accepted_tokens for o in outs)
    assert accepted > n // 10 and rejected > n // 10, (accepted, rejected)
    assert two_sample_pvalue(*counts) > 1e-3


def test_stop_inside_an_accepted_draft_and_abort_while_speculating(hybrids):
    """A stop token inside an accepted draft ends the request where plain decoding does (its slot and
    snapshot within what it kept); an abort mid-speculation frees its slot and pages; the rest of the
    batch continues unchanged."""
    d = hybrids["odd-heads-1to1-tied"]
    gen = torch.Generator().manual_seed(9)
    text = random_ids(gen, 80)
    prompt = text + random_ids(gen, 4) + text[:3]
    reply = text[3:73]
    stop = SamplingParams(max_tokens=70, forced_tokens=reply, ignore_eos=True, stop_token_ids=[reply[40]])
    free = SamplingParams(max_tokens=70, forced_tokens=reply[:30], ignore_eos=True)
    ref = _run(tiny_engine(d, page_size=4), [prompt] * 3, [stop, free, free])
    eng = tiny_engine(d, page_size=4, speculative="ngram")
    reqs = [eng.make_request(prompt, sp) for sp in (stop, free, free)]

    def abort_second(e: Engine, outs) -> None:
        if reqs[1].accepted_tokens > 0 and reqs[1].finish_reason is None:
            e.abort(reqs[1].request_id)

    run_checked(eng, reqs, on_step=abort_second)
    assert_no_request_pages(eng)
    assert reqs[1].finish_reason == "abort"
    assert reqs[0].finish_reason == ref[0].finish_reason == "stop" and reqs[0].accepted_tokens > 0
    assert reqs[0].output_ids == ref[0].output_ids and reqs[2].output_ids == ref[2].output_ids


@pytest.mark.parametrize("shape", ["gemma3-odd", "mistral"])  # Gemma 4's window layers need rings
def test_window_models_with_paged_kv_speculate_with_output_unchanged(tmp_path, shape):
    """Sliding-window models with their window layers' KV in pages (``--no-window-paging``): a
    rejected draft's KV is rolled back like a dense model's (its pages freed), the window mask sees
    only accepted positions, so greedy output equals plain decoding's over replies several windows
    long."""
    d = make_tiny_windowed(tmp_path / "w", shape)
    prompts, params = _copying(3, 6)
    ref = _run(tiny_engine(d, chunk_size=40, window_paging=False), prompts, params)
    got = _run(tiny_engine(d, chunk_size=40, window_paging=False, speculative="suffix"), prompts, params)
    assert [r.output_ids for r in got] == [r.output_ids for r in ref]
    drafted, accepted = sum(r.drafted_tokens for r in got), sum(r.accepted_tokens for r in got)
    assert 0 < accepted < drafted, "drafts must be both accepted and rejected, or the test proves nothing"


def test_window_paged_models_are_refused_clearly(tmp_path):
    d = make_tiny_windowed(tmp_path / "w", "gemma3-odd")
    with pytest.raises(EngineError, match="window-paged models"):
        tiny_engine(d, speculative="ngram")
    tiny_engine(d, speculative="ngram", window_paging=False)  # its KV in pages: drafts roll back
