"""The gRPC worker's requests take HTTP's admission path (``core.generate.admit_run``), in process on a
tiny model: the same tokens and cache hits as the HTTP route for the same ids and key, a tenant's
scope shared across both fronts and never across tenants, the engine's refusal of a bad prompt in
the same words as HTTP's 400, and every admitted slot given back, refused or not."""

from __future__ import annotations

import grpc
import pytest
from fastapi.testclient import TestClient
from smg_grpc_proto.generated import vllm_engine_pb2, vllm_engine_pb2_grpc

from kvreuse.runtime.cluster.services import free_port
from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.grpc.serve import grpc_worker
from kvreuse.runtime.server.state import ServerConfig
from tests.helpers import make_tiny_model

pytestmark = pytest.mark.timeout(300)
KEYS = {"key-a": "A", "key-b": "B"}
PS = 16


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model_dir = make_tiny_model(tmp_path_factory.mktemp("grpc_admission") / "m", vocab=49152)
    engine = Engine(model_dir=str(model_dir), dtype="float32", device="cpu", num_pages=256, page_size=PS)
    aengine = AsyncEngine(engine)
    port = free_port()
    app = create_app(aengine, ServerConfig("tiny", api_keys=KEYS), on_shutdown=aengine.shutdown,
                     services=[lambda st: grpc_worker(st, "127.0.0.1", port)])  # fmt: skip
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield client, vllm_engine_pb2_grpc.VllmEngineStub(channel), app.state.kv


def _grpc(stub, ids: list[int], key: str, max_tokens: int = 4) -> vllm_engine_pb2.GenerateComplete:
    req = vllm_engine_pb2.GenerateRequest(
        request_id="r", tokenized=vllm_engine_pb2.TokenizedInput(input_ids=ids), stream=False,
        sampling_params=vllm_engine_pb2.SamplingParams(temperature=0, max_tokens=max_tokens),
    )  # fmt: skip
    (out,) = list(stub.Generate(req, metadata=[("authorization", f"Bearer {key}")], timeout=120))
    return out.complete


def _http(client, ids: list[int], key: str, max_tokens: int = 4):
    body = {"model": "tiny", "prompt": ids, "max_tokens": max_tokens, "temperature": 0}
    return client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})


def test_grpc_and_http_share_a_tenants_scope_and_give_the_same_tokens(served):
    client, stub, state = served
    ids = list(range(200, 200 + 5 * PS + 3))
    first = _grpc(stub, ids, "key-a")
    assert first.cached_tokens == 0 and first.prompt_tokens == len(ids)
    http = _http(client, ids, "key-a")
    assert http.status_code == 200, http.text
    usage = http.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 5 * PS  # gRPC's pages, in A's scope
    assert http.json()["choices"][0]["text"] == state.tokenizer.decode(list(first.output_ids))
    other = _grpc(stub, ids, "key-b")  # B never hits A's prefix
    assert other.cached_tokens == 0 and list(other.output_ids) == list(first.output_ids)
    again = _grpc(stub, ids, "key-b")
    assert again.cached_tokens == 5 * PS
    assert state.in_flight == 0 and state.tenants.in_flight["A"] == state.tenants.in_flight["B"] == 0


def test_a_bad_prompt_is_refused_as_http_refuses_it_and_nothing_stays_held(served):
    client, stub, state = served
    bad = [1, 2, 10**7]  # outside the vocabulary: the engine's admission refuses it
    http = _http(client, bad, "key-a")
    assert http.status_code == 400
    with pytest.raises(grpc.RpcError) as e:
        _grpc(stub, bad, "key-a")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == http.json()["error"]["message"]
    assert state.in_flight == 0 and state.tenants.in_flight["A"] == 0
