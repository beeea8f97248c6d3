"""``Engine.load()``, what a gateway reads at ``/v1/loads``: pages a request holds count as used, the
cached pages nobody holds do not (a pool full of cache is a replica's steady state; SMG's overload
veto read it as a full replica and stopped routing to every replica whose cache had filled)."""

from __future__ import annotations

import torch

from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.loads import worker_load
from tests.engine_drive import greedy, random_ids, tiny_engine


def test_cached_pages_are_not_load_and_held_pages_are(tiny_models):
    eng: Engine = tiny_engine(tiny_models[("llama", False)], num_pages=16, chunk_size=256)
    prompt = random_ids(torch.Generator().manual_seed(0), 200)
    req = eng.make_request(prompt, greedy(2))
    eng.submit(req)
    eng.step()  # prefilled: the request holds its pages
    running, _, used, total = eng.load()
    assert running == 1 and used == len(req.pages) >= 200 // 16, (used, len(req.pages))
    while eng.has_work():
        eng.step()
    stats = eng.cache.check_integrity()
    assert stats.tree_pages >= 200 // 16  # its pages stay in the tree, evictable ...
    assert eng.load() == (0, 0, 0, total)  # ... and are no load
    rank = worker_load(eng)["loads"][0]
    assert rank["token_usage"] == 0 and rank["num_used_tokens"] == 0
