"""Sampling with speculation keeps the output distribution (chi-square tests), and the draft sources:
n-gram lookup, a tenant's history, the adaptive draft length."""

from __future__ import annotations

import torch

from kvreuse.runtime.request import CacheScope
from kvreuse.runtime.sampling.draws import Draws
from kvreuse.runtime.sampling.params import SamplingParams
from kvreuse.runtime.speculative.draft_length import DraftLength
from kvreuse.runtime.speculative.drafter import SuffixLookup
from kvreuse.runtime.speculative.ngram_index import NgramIndex
from kvreuse.runtime.speculative.verify import verify
from tests.engine_drive import random_ids, tiny_engine


def chi2_pvalue(observed: list[float], expected: list[float]) -> float:
    """Pearson's goodness of fit, categories with expected < 5 merged into one."""
    obs, exp, rest_o, rest_e = [], [], 0.0, 0.0
    for o, e in zip(observed, expected):
        if e >= 5:
            obs.append(o)
            exp.append(e)
        else:
            rest_o, rest_e = rest_o + o, rest_e + e
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2), torch.tensor(stat / 2)))


def two_sample_pvalue(a: dict, b: dict) -> float:
    """Chi-square test of homogeneity of two samples' category counts (rare categories merged)."""
    na, nb = sum(a.values()), sum(b.values())
    keys = sorted(set(a) | set(b), key=lambda k: -(a.get(k, 0) + b.get(k, 0)))
    obs, exp = [], []
    for k in keys:
        tot = a.get(k, 0) + b.get(k, 0)
        obs += [a.get(k, 0), b.get(k, 0)]
        exp += [tot * na / (na + nb), tot * nb / (na + nb)]
    # merge by rows of two: categories whose expected counts are small go to "other" together
    big = [i for i in range(0, len(obs), 2) if min(exp[i], exp[i + 1]) >= 5]
    small = [i for i in range(0, len(obs), 2) if i not in big]
    o2 = [obs[i + s] for i in big for s in (0, 1)] + [
        sum(obs[i] for i in small),
        sum(obs[i + 1] for i in small),
    ]
    e2 = [exp[i + s] for i in big for s in (0, 1)] + [
        sum(exp[i] for i in small),
        sum(exp[i + 1] for i in small),
    ]
    if not small:
        o2, e2 = o2[:-2], e2[:-2]
    stat = sum((o - e) ** 2 / e for o, e in zip(o2, e2) if e > 0)
    df = len(o2) // 2 - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2), torch.tensor(stat / 2)))


def test_rejection_rule_draws_each_position_from_the_target_distribution():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 8, generator=gen) * 1.5
    p = SamplingParams(temperature=0.9, top_k=6, max_tokens=4)
    probs = [
        torch.softmax((row / 0.9).masked_fill(row / 0.9 < torch.topk(row / 0.9, 6).values[-1], -1e9), -1)
        for row in logits
    ]
    draft = [int(probs[0].argmax()), int(probs[1].argsort()[-3])]  # a likely and a less likely draft
    n = 6000
    first = [0] * 8
    second = [0] * 8
    accepted = 0
    for k in range(n):
        res = verify(logits, [p], [Draws(k)], None, [draft])
        t0 = res.tokens[0]
        first[t0] += 1
        if t0 == draft[0]:
            accepted += 1
            second[res.verified[0][0][0]] += 1  # position 1's target, given the draft's first token
    assert chi2_pvalue(first, [n * float(x) for x in probs[0]]) > 1e-3
    assert chi2_pvalue(second, [accepted * float(x) for x in probs[1]]) > 1e-3
    assert abs(accepted / n - float(probs[0][draft[0]])) < 0.02


def test_temperature_sampling_distribution_unchanged_in_the_engine(tiny_models):
    """A tiny model's next two tokens after a forced one, sampled with and without speculation: the
    n-gram draft is the token that followed earlier in the prompt; the pairs' counts are the same
    distribution (chi-square homogeneity)."""
    d = tiny_models[("llama", False)]
    gen = torch.Generator().manual_seed(2)
    a, x, y, z = random_ids(gen, 4)
    prompt = random_ids(gen, 12) + [a, x, y, z] + random_ids(gen, 8) + [a]
    n = 400
    # the bias (part of the target distribution in both runs) makes the drafts likely enough to be
    # accepted often and rejected often, so both branches of the rule are exercised
    kw = dict(
        max_tokens=3,
        temperature=1.0,
        top_k=5,
        forced_tokens=[x],
        ignore_eos=True,
        logit_bias={y: 3.0, z: 3.0},
    )
    counts = []
    accepted = 0
    for mode in ("off", "ngram"):
        eng = tiny_engine(d, speculative=mode, max_running=n, num_pages=1024)
        outs = eng.generate([prompt] * n, [SamplingParams(**kw, seed=s) for s in range(n)])
        c: dict = {}
        for o in outs:
            key = tuple(o.output_token_ids[1:])
            c[key] = c.get(key, 0) + 1
        counts.append(c)
        accepted += sum(o.accepted_tokens for o in outs)
    assert accepted > n // 10, accepted  # drafts were really verified and often accepted
    assert two_sample_pvalue(*counts) > 1e-3


def test_ngram_index_finds_the_latest_longest_match_and_never_the_query_itself():
    idx = NgramIndex((3, 2))
    toks = [1, 2, 3, 9, 1, 2, 7, 5, 1, 2]
    idx.update(toks)
    assert idx.lookup(toks) == (2, 6)  # "1 2" last seen before 7
    toks += [7]
    idx.update(toks)
    assert idx.lookup(toks) == (3, 7)  # "1 2 7" -> 5
    assert NgramIndex((2,)).lookup([4, 4]) == (0, -1)


def test_suffix_history_is_per_tenant_and_never_spans_two_sequences():
    s = SuffixLookup(start=8, most=8)
    s.finish("r1", [5, 6, 7, 8, 9, 10], "a")
    s.finish("r2", [11, 12, 13], "a")
    assert s.propose("q1", [1, 2, 6, 7], "a", 8) == [8, 9, 10]  # stops at the sequence's end
    assert s.propose("q2", [1, 2, 6, 7], "b", 8) == []  # another tenant's history is not seen
    assert s.propose("q3", [1, 2, 9, 10], "a", 8) == []  # "9 10" is followed by a separator only
    assert s.propose("q4", [1, 2, 6, 7], CacheScope().namespace, 8) == []


def test_draft_length_grows_on_acceptance_and_pauses_after_misses():
    k = DraftLength(start=4, most=16)
    assert k.next() == 4
    k.observe(4, 4)
    assert k.next() == 8
    k.observe(8, 3)
    assert k.next() == 4
    k.observe(4, 0)
    assert [k.next() for _ in range(3)] == [0, 0, 2]
    k.observe(2, 0)
    assert [k.next() for _ in range(5)] == [0, 0, 0, 0, 2]
