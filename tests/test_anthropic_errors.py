"""Refusals of the ASGI request guard (401 key, 413 size, Host and Content-Type) and the model lookup
(``GET /v1/models/{id}``, 404 for an unknown id) answer in the caller's protocol: Anthropic's shape,
as the official ``anthropic`` SDK types it, on the Messages routes and on the models routes when
``anthropic-version`` is sent; OpenAI's shape (checked with the ``openai`` SDK) everywhere else."""

from __future__ import annotations

import anthropic
import openai
import pytest
from fastapi.testclient import TestClient

from kvreuse.runtime.engine.async_engine import AsyncEngine
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.server.app import create_app
from kvreuse.runtime.server.state import ServerConfig

MODEL = "smol"
LIMIT = 4096  # --max-request-bytes
OK = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def http():
    aengine = AsyncEngine(Engine(None, kv_cache_memory="32M", max_model_len=2048))
    config = ServerConfig(MODEL, allowed_hosts=("testserver",), max_request_bytes=LIMIT)
    app = create_app(aengine, config, on_shutdown=aengine.shutdown)
    with TestClient(app, raise_server_exceptions=False) as client:
        client.app_state = app.state.kv
        yield client


def _anthropic(http, host: str = "testserver", **kw) -> anthropic.Anthropic:
    kw.setdefault("api_key", "none")
    return anthropic.Anthropic(base_url=f"http://{host}", http_client=http, max_retries=0, **kw)


def _openai(http, host: str = "testserver", key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{host}/v1", api_key=key, http_client=http, max_retries=0)


def _anthropic_shaped(e: anthropic.APIStatusError, kind: str) -> None:
    assert e.type == kind and e.body["type"] == "error" and e.body["error"]["message"], e.body


@pytest.fixture
def keyed(http):
    state = http.app_state
    state.tenants.keys = {"sk-good": "team"}
    yield
    state.tenants.keys = {}


def test_missing_or_bad_key(http, keyed):
    # the SDK refuses to send no key at all, so the missing key goes raw
    body = {"model": MODEL, "max_tokens": 2, "messages": OK}
    r = http.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 401 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "authentication_error"
    for client in (_anthropic(http, api_key="sk-bad"), _anthropic(http, api_key=None, auth_token="sk-bad")):
        with pytest.raises(anthropic.AuthenticationError) as e:
            client.messages.create(model=MODEL, max_tokens=2, messages=OK)
        _anthropic_shaped(e.value, "authentication_error")
        with pytest.raises(anthropic.AuthenticationError) as e:
            client.messages.count_tokens(model=MODEL, messages=OK)
        _anthropic_shaped(e.value, "authentication_error")
        with pytest.raises(anthropic.AuthenticationError) as e:
            client.models.list()
        _anthropic_shaped(e.value, "authentication_error")
    with pytest.raises(openai.AuthenticationError) as e:
        _openai(http, key="sk-bad").models.list()
    assert e.value.body["type"] == "authentication_error" and e.value.code == "invalid_api_key"
    assert (
        _anthropic(http, api_key="sk-good").messages.count_tokens(model=MODEL, messages=OK).input_tokens > 0
    )


def test_body_too_large(http):
    big = [{"role": "user", "content": "x" * LIMIT}]
    client = _anthropic(http)
    with pytest.raises(anthropic.RequestTooLargeError) as e:
        client.messages.create(model=MODEL, max_tokens=2, messages=big)
    _anthropic_shaped(e.value, "request_too_large")
    with pytest.raises(anthropic.RequestTooLargeError) as e:
        client.messages.count_tokens(model=MODEL, messages=big)
    _anthropic_shaped(e.value, "request_too_large")

    def chunks():  # no Content-Length: the guard counts the bytes as they arrive
        yield b'{"model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": "'
        yield b"x" * LIMIT
        yield b'"}]}'

    r = http.post("/v1/messages", content=chunks(), headers={"content-type": "application/json"})
    assert (
        r.status_code == 413
        and r.json()["error"]["type"] == "request_too_large"
        and r.json()["type"] == "error"
    )
    with pytest.raises(openai.APIStatusError) as e:
        _openai(http).chat.completions.create(model=MODEL, messages=big)
    assert (
        e.value.status_code == 413 and e.value.code == "too_large" and "type" not in e.value.response.json()
    )


def test_host_and_content_type_refusals(http):
    with pytest.raises(anthropic.BadRequestError) as e:
        _anthropic(http, host="evil.example").messages.create(model=MODEL, max_tokens=2, messages=OK)
    _anthropic_shaped(e.value, "invalid_request_error")
    assert "Host" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.APIStatusError) as e:
        _anthropic(http).messages.create(model=MODEL, max_tokens=2, messages=OK,
                                         extra_headers={"Content-Type": "text/plain"})  # fmt: skip
    assert e.value.status_code == 415
    _anthropic_shaped(e.value, "invalid_request_error")
    with pytest.raises(openai.BadRequestError) as e:
        _openai(http, host="evil.example").chat.completions.create(model=MODEL, messages=OK)
    assert e.value.code == "invalid_host" and e.value.body["type"] == "invalid_request_error"


def test_model_lookup_in_both_shapes(http):
    got = _anthropic(http).models.retrieve(MODEL)
    assert (got.type, got.id, got.display_name) == ("model", MODEL, MODEL) and got.created_at.year >= 2024
    alias = _anthropic(http).models.retrieve("claude-sonnet-4-5")  # Claude Code's names reach the model
    assert alias.id == "claude-sonnet-4-5" and alias.display_name == MODEL
    with pytest.raises(anthropic.NotFoundError) as e:
        _anthropic(http).models.retrieve("gpt-4o")
    _anthropic_shaped(e.value, "not_found_error")
    card = _openai(http).models.retrieve(MODEL)
    assert (card.object, card.id, card.owned_by) == ("model", MODEL, "kvreuse")
    assert card.model_dump() == _openai(http).models.list().data[0].model_dump()
    with pytest.raises(openai.NotFoundError) as e:
        _openai(http).models.retrieve("claude-sonnet-4-5")  # aliases are the Anthropic routes' only
    assert e.value.code == "model_not_found" and "type" not in e.value.response.json()
    r = http.get("/v1/messages/nowhere", headers={"anthropic-version": "2023-06-01"})
    assert r.status_code in (404, 405) and r.json()["type"] == "error"
