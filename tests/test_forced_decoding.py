"""Forced decoding: the engine emits the given ids as generated tokens and caches their KV like a reply."""

from __future__ import annotations

import pytest
import torch

from kvreuse.runtime.sampling.params import SamplingParams
from tests.engine_drive import random_ids, tiny_engine


def test_forced_tokens_are_emitted_counted_as_generated_and_cached(tiny_models):
    eng = tiny_engine(tiny_models[("llama", False)])
    gen = torch.Generator().manual_seed(3)
    prompt, reply = random_ids(gen, 40), random_ids(gen, 21)
    out = eng.generate([prompt], SamplingParams(max_tokens=len(reply), forced_tokens=reply, ignore_eos=True))[
        0
    ]
    assert out.output_token_ids == reply
    assert out.prefilled_tokens == len(prompt)  # the reply is decoded, not prefilled
    assert eng.stats().generated_tokens == len(reply)
    # next turn: prompt + reply + new text reuses every whole page of prompt + reply[:-1] (the last
    # forced token was emitted from the final logits and never run through the model)
    nxt = prompt + reply + random_ids(gen, 10)
    out2 = eng.generate([nxt], SamplingParams(max_tokens=1))[0]
    assert out2.cached_tokens == (len(prompt) + len(reply) - 1) // 16 * 16
    # sampling resumes after the forced ids; greedy continuation equals an unforced run of the same prefix
    more = eng.generate([prompt], SamplingParams(max_tokens=len(reply) + 3, forced_tokens=reply))[0]
    ref = eng.generate([prompt + reply], SamplingParams(max_tokens=3))[0]
    assert more.output_token_ids[len(reply) :] == ref.output_token_ids


def test_more_forced_tokens_than_max_tokens_is_an_error():
    with pytest.raises(ValueError, match="forced tokens exceed"):
        SamplingParams(max_tokens=2, forced_tokens=[5, 6, 7])
