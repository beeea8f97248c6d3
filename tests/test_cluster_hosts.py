"""The across-hosts layout of ``docs/scaling.md``, run: store, replicas and gateway on hosts of their own.

Each part runs in a network namespace of its own (``benchmarks/cluster/emulated_hosts.py``), joined by a
bridge shaped to 10 Gbit/s: the replicas bind their host's address and are reached there by the
gateway, which runs on a third host; Valkey runs on a fourth; this test is the client, on the
bridge.  Nothing crosses a loopback interface, so a part that still assumed ``127.0.0.1`` (a
replica's Host-header guard, the gateway's health checks, a store URL) fails here.  Tenants use
API keys, as the documented command does.
"""

from __future__ import annotations

import time

import httpx
import pytest
from openai import OpenAI

from kvreuse.benchmarks.cluster.emulated_hosts import EmulatedHosts, unavailable
from kvreuse.runtime.cluster.cluster import Cluster, Placement
from tests.cluster_checks import FAST_FAILOVER, served_by, session_survives_its_replica
from tests.helpers import make_tiny_model, metric_value

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
PS = 16
KEYS = {"alice": "k-alice", "bob": "k-bob", "@operator": "k-operator"}


@pytest.fixture(scope="module")
def hosts():
    if why := unavailable():
        pytest.skip(why)
    with EmulatedHosts(["store", "r0", "r1", "gw"], rate="10gbit") as h:
        yield h


@pytest.fixture(scope="module")
def cluster(hosts, tmp_path_factory):
    root = tmp_path_factory.mktemp("hosts")
    model = make_tiny_model(root / "m", vocab=49152)
    (root / "keys").write_text("".join(f"{key} {tenant}\n" for tenant, key in KEYS.items()))
    serve = ["--model", str(model), "--dtype", "float32", "--page-size", str(PS), "--served-model-name", "tiny",
             "--kv-cache-memory", "8M", "--no-ui", "--allowed-hosts", "*", "--api-key-file", str(root / "keys")]  # fmt: skip
    placement = Placement(store=hosts["store"], replicas=(hosts["r0"], hosts["r1"]), gateway=hosts["gw"])
    (root / "run").mkdir()
    with Cluster(2, serve, workdir=root / "run", gateway_args=FAST_FAILOVER, placement=placement) as c:
        yield c


def _metrics(url: str) -> str:
    """A replica's /metrics (an operator route when keys are on)."""
    return httpx.get(
        url + "/metrics", headers={"Authorization": f"Bearer {KEYS['@operator']}"}, timeout=5
    ).text


def test_each_part_is_reached_at_its_own_hosts_address(cluster, hosts):
    assert cluster.url.startswith(f"http://{hosts['gw'].address}:")
    assert cluster.public_store_url.startswith(f"valkey://{hosts['store'].address}:")  # its password left out
    assert cluster.store_url.startswith(f"valkey://:{cluster.store_password}@{hosts['store'].address}:")
    assert [u.split("//")[1].split(":")[0] for u in cluster.urls] == [
        hosts["r0"].address,
        hosts["r1"].address,
    ]
    listed = httpx.get(cluster.url + "/workers", headers=cluster.auth.headers(), timeout=10).json()["workers"]
    assert sorted(w["url"] for w in listed) == sorted(cluster.urls)
    # the gateway polls each replica's load (an operator route) with its operator key, never refused
    for url in cluster.urls:
        end = time.monotonic() + 20  # it polls every second once the worker is registered
        while '{endpoint="/v1/loads",status="200"}' not in (text := _metrics(url)) and time.monotonic() < end:
            time.sleep(0.5)
        assert metric_value(text, "kvreuse_http_requests_total", '{endpoint="/v1/loads",status="200"}') > 0
        assert (
            '{endpoint="/v1/loads",status="403"}' not in text
            and '{endpoint="/v1/loads",status="401"}' not in text
        )
    # a replica is not on this host's loopback: what reaches it crossed the bridge
    port = cluster.urls[0].rsplit(":", 1)[1]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


def test_a_session_moves_host_and_reads_its_prefix_from_the_store_host(cluster):
    alice = OpenAI(base_url=cluster.url + "/v1", api_key=KEYS["alice"], max_retries=0)
    operator = {"Authorization": f"Bearer {KEYS['@operator']}"}
    # kills a replica: the module's tests that need every part come before it (pytest keeps file order)
    messages = session_survives_its_replica(cluster, alice, PS, operator)  # the third turn on the other host

    def turn(client: OpenAI) -> dict:
        return client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=8, temperature=0
        ).model_dump()

    # another tenant sending the same conversation finds nothing: not in the pool, not in the store
    bob = OpenAI(base_url=cluster.url + "/v1", api_key=KEYS["bob"], max_retries=0)
    assert turn(bob)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert turn(alice)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the same prompt is cached


def test_a_request_without_a_key_is_refused_through_the_gateway(cluster):
    r = httpx.post(cluster.url + "/v1/chat/completions", timeout=30,
                   json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})  # fmt: skip
    assert r.status_code == 401, r.text


@pytest.fixture(scope="module")
def events_cluster(tmp_path_factory):
    """``--routing events`` across hosts, the gateway on a host without the replicas' files: the
    model directory and the cache directory (where a replica writes the tokenizer bundle it names as
    ``tokenizer_path``) are empty there, so the gateway must fetch the bundle by ``GetTokenizer``."""
    if why := unavailable():
        pytest.skip(why)
    root = tmp_path_factory.mktemp("events")
    model = make_tiny_model(root / "files" / "m", vocab=49152)
    serve = ["--model", str(model), "--dtype", "float32", "--page-size", str(PS), "--served-model-name", "tiny",
             "--kv-cache-memory", "1M", "--no-ui", "--allowed-hosts", "*"]  # fmt: skip
    gateway = ["--worker-warmup-secs", "0", "--worker-warmup-divert-every", "0"]
    (root / "run").mkdir()
    with (
        pytest.MonkeyPatch.context() as mp,
        EmulatedHosts(["r0", "r1", "gw"], rate="10gbit", hidden={"gw": [root / "files"]}) as hosts,
    ):
        mp.setenv("KVREUSE_CACHE", str(root / "files" / "cache"))  # the replicas' cache directory
        placement = Placement(replicas=(hosts["r0"], hosts["r1"]), gateway=hosts["gw"])
        with Cluster(2, serve, shared_store="none", workdir=root / "run", gateway_args=gateway, routing="events",
                     placement=placement) as c:  # fmt: skip
            yield c


def test_events_routing_across_hosts_tokenizes_with_the_fetched_bundle(events_cluster):
    c = events_cluster
    assert all(u.startswith("grpc://10.") for u in c.worker_urls)
    messages = [{"role": "user", "content": "Summarise the build log in one line, please."}]
    body = {"model": "tiny", "messages": messages, "max_tokens": 12, "temperature": 0}
    via = httpx.post(c.url + "/v1/chat/completions", json=body, timeout=60).json()
    direct = httpx.post(c.urls[0] + "/v1/chat/completions", json=body, timeout=60).json()
    assert via["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
    assert via["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]  # the same template, tokenizer

    # a session's next turn goes where the events say its pages are
    session = [{"role": "user", "content": "List every file under src/ and say what each does. " * 4}]
    before = served_by(c.urls)
    httpx.post(
        c.url + "/v1/chat/completions", json={**body, "messages": session}, timeout=60
    ).raise_for_status()
    owner = max(range(2), key=lambda i: served_by(c.urls)[i] - before[i])
    time.sleep(1.0)  # the stored pages' events reach the gateway's index
    session += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "Now the tests."}]
    httpx.post(
        c.url + "/v1/chat/completions", json={**body, "messages": session}, timeout=60
    ).raise_for_status()
    assert served_by(c.urls)[owner] - before[owner] == 2
