"""The gateway must not shed a request that a replica would queue: SMG's KV-usage veto vs kvreuse.

SMG leaves out of routing a worker whose reported KV usage is at or above a threshold (0.8 by
default), and with a dead worker beside the vetoed ones it answers 503.  A kvreuse replica admits by
pages and queues what its pool cannot hold yet, so pages held at 0.8 are not a reason to refuse:
`runtime/cluster/services.py` starts SMG with the threshold at 1.0.  Here two real replicas of a tiny
model: one is SIGKILLed, the survivor holds 7/8 of its pool under a prewarm pin (pinned pages are
load, ``tests/test_engine_load.py``), and a chat through the gateway must be served.  With SMG's
default threshold it got 503 "no available workers": SMG 1.13 sends a request to the least-loaded
worker when every worker is vetoed, but a dead one is not vetoed, only unhealthy, so nothing was left
(a failover benchmark run with small pools lost a request this way).
"""

from __future__ import annotations

import time

import httpx
import pytest

from kvreuse.runtime.cluster.cluster import Cluster
from kvreuse.runtime.loading.tokenizer import load_tokenizer
from kvreuse.runtime.models.config import ModelConfig
from tests.helpers import make_tiny_model

pytestmark = pytest.mark.timeout(300)
PS, PAGES = 16, 64


def test_a_replica_with_most_pages_pinned_still_gets_requests(tmp_path):
    model = make_tiny_model(tmp_path / "m", vocab=49152)
    pool = PAGES * PS * ModelConfig.from_dir(model).kv_bytes_per_token(4)
    serve = ["--model", str(model), "--dtype", "float32", "--page-size", str(PS), "--served-model-name", "tiny",
             "--kv-cache-memory", str(pool), "--pinned-fraction", "0.95", "--no-ui"]  # fmt: skip
    # a prompt of about 7/8 of the pool, to be pinned by a prewarm for the session TTL
    tok, n = load_tokenizer(model), 100

    def length(words: int) -> int:
        ids = tok.apply_chat_template(
            [_user(words)], tokenize=True, add_generation_prompt=True, return_dict=True
        )
        return len(ids["input_ids"])

    while length(n) < 0.85 * PAGES * PS:
        n += 20
    (tmp_path / "run").mkdir()
    gateway = ["--health-check-interval-secs", "1", "--health-failure-threshold", "1"]
    with Cluster(2, serve, shared_store="none", workdir=tmp_path / "run", gateway_args=gateway) as c:
        survivor = c.urls[1]
        r = httpx.post(
            survivor + "/v1/cache/prewarm", json={"model": "tiny", "messages": [_user(n)]}, timeout=60
        )
        assert r.status_code == 200 and r.json()["pinned"], r.text
        usage = httpx.get(survivor + "/v1/loads", timeout=5).json()["loads"][0]["token_usage"]
        assert 0.8 <= usage < 1.0, usage
        c.kill_replica(0)
        time.sleep(4)  # the gateway polls loads every second and has marked replica 0 unhealthy
        r = httpx.post(c.url + "/v1/chat/completions", timeout=60,
                       json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})  # fmt: skip
        assert r.status_code == 200, r.text


def _user(words: int) -> dict:
    return {"role": "user", "content": " ".join(f"w{i}" for i in range(words))}
