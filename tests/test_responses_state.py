"""Issue 35: stored responses in-process on a tiny model: visible only to their tenant, surviving a
restart with the KV store (records and pages), deleted with their pin."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.helpers import make_tiny_model, server_client

pytestmark = pytest.mark.timeout(300)
KEYS = {"key-a": "A", "key-b": "B"}
PS = 16
LONG = " ".join(f"word{i}" for i in range(120))


def _client(model_dir, store=None, keys=None) -> TestClient:
    return server_client(model_dir, store, keys, page_size=PS)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("responses") / "m", vocab=49152)


def _create(c: TestClient, key: str | None = None, **body) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = c.post(
        "/v1/responses",
        json={"model": "tiny", "max_output_tokens": 4, "temperature": 0, **body},
        headers=headers,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_responses_are_visible_only_to_their_tenant(model_dir):
    with _client(model_dir, keys=KEYS) as c:
        a = _create(c, "key-a", input=LONG)
        auth = {"a": {"Authorization": "Bearer key-a"}, "b": {"Authorization": "Bearer key-b"}}
        assert c.get(f"/v1/responses/{a['id']}", headers=auth["a"]).json()["id"] == a["id"]
        foreign = [
            c.get(f"/v1/responses/{a['id']}", headers=auth["b"]),
            c.delete(f"/v1/responses/{a['id']}", headers=auth["b"]),
            c.post(f"/v1/responses/{a['id']}/cancel", headers=auth["b"]),
            c.post(
                "/v1/responses",
                headers=auth["b"],
                json={"model": "tiny", "input": "more", "previous_response_id": a["id"]},
            ),  # fmt: skip
            c.get("/v1/responses/resp-made-up", headers=auth["a"]),
        ]
        for r in foreign:  # another tenant's id is as unknown as a made-up one, in the Responses shape
            assert r.status_code == 404, r.text
            assert set(r.json()["error"]) == {"message", "type", "param", "code"} and "not found" in r.text
        b = _create(c, "key-b", input="more", previous_response_id=None)
        assert b["usage"]["input_tokens_details"]["cached_tokens"] == 0


def test_stored_responses_survive_a_restart_with_the_kv_store(model_dir, tmp_path):
    with _client(model_dir, store=tmp_path) as c:
        first = _create(c, input=LONG, instructions="Be brief.")
        second = _create(c, input="Go on.", instructions="Be brief.", previous_response_id=first["id"])
        assert (
            second["usage"]["input_tokens_details"]["cached_tokens"]
            == (first["usage"]["total_tokens"] - 1) // PS * PS
        )
    assert list(tmp_path.glob("responses-*.jsonl"))
    with _client(model_dir, store=tmp_path) as c:  # a fresh engine: the pool is empty, the disk tier is not
        assert c.get(f"/v1/responses/{second['id']}").json() == second
        third = _create(c, input="And then?", instructions="Be brief.", previous_response_id=second["id"])
        cached = third["usage"]["input_tokens_details"]["cached_tokens"]
        assert cached == (second["usage"]["total_tokens"] - 1) // PS * PS
        assert third["kvreuse"]["cache"]["cached_by_tier"]["disk"] == cached


def test_delete_drops_the_record_and_its_pin(model_dir):
    with _client(model_dir) as c:
        r = _create(c, input=LONG)
        ids = lambda: [s["id"] for s in c.get("/v1/cache").json()["sessions"]]  # noqa: E731
        assert r["id"] in ids()
        assert c.delete(f"/v1/responses/{r['id']}").json() == {
            "id": r["id"],
            "object": "response.deleted",
            "deleted": True,
        }
        assert r["id"] not in ids() and c.get(f"/v1/responses/{r['id']}").status_code == 404
        assert c.delete(f"/v1/responses/{r['id']}").status_code == 404
        done = c.post(f"/v1/responses/{_create(c, input='x')['id']}/cancel")
        assert done.status_code == 400 and "only a response being generated" in done.text
