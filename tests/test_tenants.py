"""Tenant namespaces in the prefix cache: no cross-tenant hits, except the opted-in public prefix.

Expected counts come from lengths (whole pages of ``prompt[:-1]``), never from the engine.
"""

from __future__ import annotations

import torch

from kvreuse.runtime.request import CacheScope
from tests.engine_drive import greedy, random_ids, run_checked, tiny_engine

PAGE = 16


def _run(eng, prompt, scope):
    req = eng.make_request(prompt, greedy(2))
    req.scope = scope
    run_checked(eng, [req])
    return req.cached_tokens


def test_a_tenant_never_hits_another_tenants_prefix(tiny_models):
    eng = tiny_engine(tiny_models[("llama", False)], page_size=PAGE, num_pages=128)
    gen = torch.Generator().manual_seed(0)
    prompt = random_ids(gen, 150)
    assert _run(eng, prompt, CacheScope("A")) == 0
    assert _run(eng, prompt, CacheScope("B")) == 0  # A's exact prompt: nothing shared
    whole = (len(prompt) - 1) // PAGE * PAGE
    assert _run(eng, prompt, CacheScope("A")) == whole  # but A's own cache is there
    assert _run(eng, prompt, CacheScope("B")) == whole  # and B now has its own copy
    assert _run(eng, prompt, CacheScope()) == 0  # the public namespace saw none of it


def test_the_public_prefix_opt_in_shares_only_the_public_part(tiny_models):
    eng = tiny_engine(tiny_models[("llama", False)], page_size=PAGE, num_pages=128)
    gen = torch.Generator().manual_seed(1)
    system = random_ids(gen, 70)  # not page-aligned: the public part is its whole pages
    prompt = system + random_ids(gen, 80)
    public = len(system) // PAGE * PAGE
    assert _run(eng, prompt, CacheScope("A", len(system))) == 0
    assert _run(eng, prompt, CacheScope("B", len(system))) == public  # A's history stays A's
    other = system + random_ids(gen, 40)
    assert _run(eng, other, CacheScope("A", len(system))) == public
    assert _run(eng, prompt, CacheScope("A", len(system))) == (len(prompt) - 1) // PAGE * PAGE
    eng.cache.check_integrity()
