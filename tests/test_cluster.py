"""Replicas behind the SMG gateway with a shared Valkey tier: real processes, the ``openai`` client.

``Cluster`` starts a Valkey server, two ``kvreuse serve`` replicas of a tiny model and ``smg launch``
(cache-aware policy) in front; the test talks only to the gateway.  A session's second turn finds its
prefix cached; the replica that served it is SIGKILLed; the third turn still succeeds through the
gateway, on the other replica, and reads the session's previous prompt from the shared tier.
"""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from kvreuse.runtime.cluster.cluster import Cluster
from kvreuse.runtime.cluster.services import ServiceError, free_port, start_gateway
from tests.cluster_checks import FAST_FAILOVER, session_survives_its_replica
from tests.helpers import make_tiny_model

pytestmark = pytest.mark.timeout(600)
PS = 16


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    model = make_tiny_model(tmp_path_factory.mktemp("cl") / "m", vocab=49152)
    serve = ["--model", str(model), "--dtype", "float32", "--page-size", str(PS), "--served-model-name", "tiny",
             "--kv-cache-memory", "8M", "--no-ui"]  # fmt: skip
    with Cluster(2, serve, workdir=tmp_path_factory.mktemp("run"), gateway_args=FAST_FAILOVER) as c:
        yield c


def test_replicas_report_their_load_for_the_gateway(cluster):
    for url in cluster.urls:
        body = httpx.get(url + "/v1/loads", timeout=5).json()
        (rank,) = body["loads"]
        assert body["dp_rank_count"] == 1 and rank["num_running_reqs"] == 0 and rank["num_waiting_reqs"] == 0
        assert rank["max_total_num_tokens"] > 0 and 0 <= rank["token_usage"] <= 1


def test_a_session_survives_its_replica_through_the_gateway(cluster):
    session_survives_its_replica(
        cluster, OpenAI(base_url=cluster.url + "/v1", api_key="none", max_retries=0), PS
    )


def test_the_store_going_away_degrades_replicas_never_fails_a_request(cluster):
    client = OpenAI(base_url=cluster.url + "/v1", api_key="none", max_retries=0)
    cluster.store.kill()
    messages = [{"role": "user", "content": "Summarise the build log in one line."}]
    for _ in range(2):  # the first write-through meets the dead store; neither request may fail
        r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0)
        assert r.choices[0].finish_reason in ("length", "stop")
    alive = [u for svc, u in zip(cluster.replicas, cluster.urls) if svc.alive]  # one died in the test above
    health = [httpx.get(u + "/health", timeout=5) for u in alive]
    assert all(h.status_code == 200 for h in health)
    assert all(h.json()["status"] == "degraded" and "shared KV store" in h.json()["kv_store"] for h in health)


def test_cluster_command_refuses_bad_arguments_in_one_line(capsys):
    from kvreuse.runtime.cli.main import main

    assert main(["cluster", "--replicas", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "kvreuse: error: --replicas must be >= 1, got 0"


def test_a_cluster_with_api_keys_passes_each_tenants_key_through_the_gateway(tmp_path):
    """With keys on, the gateway is given an operator key (made up here: only tenant keys are given)
    for its own calls and accepts every tenant's key, which the replica still sees.  Before, SMG's
    model discovery met 401 and the cluster never came up."""
    model = make_tiny_model(tmp_path / "m", vocab=49152)
    serve = ["--model", str(model), "--dtype", "float32", "--page-size", str(PS), "--served-model-name", "tiny",
             "--kv-cache-memory", "8M", "--no-ui", "--api-key", "k-one", "--api-key", "k-two"]  # fmt: skip
    (tmp_path / "run").mkdir()
    with Cluster(1, serve, shared_store="none", workdir=tmp_path / "run") as c:
        assert c.auth.operator_key not in (None, "k-one", "k-two")
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Read the build log. " * 10}],
            "max_tokens": 2,
        }

        def cached(key: str | None) -> int:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            r = httpx.post(c.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
            assert r.status_code == (200 if key else 401), r.text
            return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] if key else -1

        assert cached("k-one") == 0 and cached("k-one") > 0
        assert cached("k-two") == 0  # another tenant: the same prompt is not shared
        cached(None)
        # a cache reset through the gateway: SMG calls each worker's /flush_cache with its operator key
        r = httpx.post(c.url + "/flush_cache", headers=c.auth.headers(), timeout=60)
        assert r.status_code == 200 and r.json()["workers_flushed"] == 1, r.text
        assert cached("k-one") == 0
        direct = httpx.post(c.urls[0] + "/flush_cache", headers={"Authorization": "Bearer k-one"}, timeout=60)
        assert direct.status_code == 403  # a tenant's key cannot drop every tenant's cache


def test_a_gateway_that_never_becomes_ready_is_stopped(tmp_path):
    """Its caller gets no handle to stop it with: a gateway left behind retries its workers on the
    CPU for as long as it lives (leaked ones took minutes of CPU beside a benchmark)."""
    port = free_port()
    with pytest.raises(ServiceError, match="not ready after 3 s"):
        start_gateway(tmp_path, ["http://127.0.0.1:9"], port=port, ready_timeout_s=3)
    with pytest.raises(httpx.ConnectError):  # nothing listens on its port any more
        httpx.get(f"http://127.0.0.1:{port}/workers", timeout=2)
