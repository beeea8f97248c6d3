"""A real ``kvreuse serve`` process driven by the official ``openai`` client: a 5-turn tool-using agent
conversation (non-streamed and streamed), cache reuse figures, tool-call assembly, diagnostics, errors,
and a graceful SIGTERM."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from kvreuse.runtime.server.launcher import ServerProcess

pytestmark = pytest.mark.timeout(300)

MODEL = "smol"
CITIES = ["Paris", "Rome", "Oslo", "Lima", "Cairo"]
RULES = " ".join(
    f"Rule {i}: when the user asks about {topic}, answer briefly, cite the tool you used, and never invent data."
    for i, topic in enumerate(
        ["weather", "time zones", "currency", "distances", "population", "holidays", "languages", "airports",
         "trains", "museums", "food", "parks", "rivers", "mountains", "beaches", "markets", "hotels", "visas",
         "ferries", "taxis"]
    )
)  # fmt: skip


def _tool(name: str, desc: str, props: dict) -> dict:
    schema = {"type": "object", "properties": props, "required": list(props)}
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": schema}}


TOOLS = [
    _tool(
        "get_weather", "Current weather for a city.", {"city": {"type": "string", "description": "City name"}}
    ),
    _tool("get_time", "Local time in a city.", {"city": {"type": "string"}}),
    _tool("convert", "Convert money.", {"amount": {"type": "number"}, "currency": {"type": "string"}}),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    args = [
        "--kv-cache-memory",
        "256M",
        "--served-model-name",
        MODEL,
        "--max-running",
        "8",
        "--shutdown-timeout",
        "5",
    ]
    proc = ServerProcess(args, log).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=120)


def _scripted_turn(messages: list[dict], k: int) -> None:
    call_id = f"call_{k}"
    args = json.dumps({"city": CITIES[k]})
    call = {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": args}}
    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps({"temp_c": 10 + k})})


def _assemble_stream(stream) -> tuple[dict, list[dict], dict]:
    """Assemble streamed deltas the way agent frameworks do; returns (message, tool_calls, last chunk)."""
    content, calls, last = "", {}, None
    for chunk in stream:
        last = chunk
        for choice in chunk.choices:
            d = choice.delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                if tc.function:
                    slot["name"] += tc.function.name or ""
                    slot["arguments"] += tc.function.arguments or ""
    return {"content": content}, [calls[i] for i in sorted(calls)], last


def _conversation(client, system: str, stream: bool) -> list[tuple[int, int]]:
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Plan my trip: check the weather."},
    ]
    figures = []
    for k in range(5):
        kwargs = dict(model=MODEL, messages=messages, tools=TOOLS, max_tokens=6, temperature=0)
        if stream:
            s = client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
            _, _, last = _assemble_stream(s)
            usage = last.usage
        else:
            usage = client.chat.completions.create(**kwargs).usage
        assert (
            usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens is not None
        )
        figures.append((usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens))
        _scripted_turn(messages, k)
    return figures


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_five_turn_tool_conversation_reuses_cache(client, stream):
    system = f"You are a travel agent ({'streamed' if stream else 'plain'} session). {RULES}"
    figures = _conversation(client, system, stream)
    print(f"\n(prompt_tokens, cached_tokens) per turn, stream={stream}: {figures}")
    assert figures[0][1] < figures[0][0] * 0.2  # a fresh conversation: (almost) nothing cached
    for prompt, cached in figures[1:]:
        assert cached >= 0.9 * prompt, figures
        assert cached < prompt  # at least one token is always computed


def test_streamed_tool_calls_match_non_streamed(client):
    messages = [
        {"role": "system", "content": f"You are a travel agent. {RULES}"},
        {"role": "user", "content": "Weather?"},
    ]
    for k in range(2):
        _scripted_turn(messages, k)
    messages.append({"role": "user", "content": "Now check the weather in Lima."})
    kwargs = dict(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=24, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    plain = client.chat.completions.create(**kwargs)
    stream = client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    msg, calls, last = _assemble_stream(iter(chunks))
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    want = [(c.function.name, c.function.arguments) for c in plain.choices[0].message.tool_calls or []]
    assert [(c["name"], c["arguments"]) for c in calls] == want
    assert msg["content"] == (plain.choices[0].message.content or "")
    print(f"\nnamed tool_choice -> {want}, content {msg['content']!r}")
    assert want and want[0][0] == "get_weather"  # the forced prefix makes the model call the named tool
    json.loads(want[0][1])
    assert all(c["id"] and c["id"].startswith("call_") for c in calls)
    assert finish == ["tool_calls"] and plain.choices[0].finish_reason == "tool_calls"
    assert last.choices == [] and sum(c.usage is not None for c in chunks) == 1
    # The same prompt a second time: all of it but the last partial page comes from the cache.
    assert last.usage.prompt_tokens_details.cached_tokens >= 0.9 * plain.usage.prompt_tokens


def test_diagnostic_names_changed_system_message(server):
    body = {"model": MODEL, "max_tokens": 2, "temperature": 0, "tools": TOOLS}
    msgs = [
        {"role": "system", "content": "Agent. Now: 2025-01-01T10:00:00Z. " + RULES},
        {"role": "user", "content": "Hi"},
    ]
    httpx.post(
        f"{server.base_url}/chat/completions", json={**body, "messages": msgs}, timeout=120
    ).raise_for_status()
    msgs[0]["content"] = msgs[0]["content"].replace("10:00:00", "10:05:00")
    r = httpx.post(f"{server.base_url}/chat/completions", json={**body, "messages": msgs}, timeout=120).json()
    diag = r["kvreuse"]["cache"]
    assert diag["cause"] == "system_changed"
    assert diag["divergence"]["message_index"] == 0 and diag["divergence"]["segment"] == "system"
    assert "10:05:00" in diag["divergence"]["before_text"] + diag["divergence"]["new_text"]
    assert "10:00:00" not in json.dumps(diag)  # nothing of the earlier request is shown
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == diag["cached_tokens"] < 40
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'kvreuse_cache_diagnosis_total{cause="system_changed"}' in metrics


def test_errors_are_openai_shaped(client, server):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    # (max_tokens beyond the context is clamped, as llama.cpp does: tests/test_max_tokens_clamp.py)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], temperature=-1
        )
    assert "temperature" in str(e.value)
    orphan = [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_9", "content": "{}"}]
    with pytest.raises(openai.BadRequestError, match="call_9"):
        client.chat.completions.create(model=MODEL, messages=orphan)
    r = httpx.post(
        f"{server.base_url}/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert client.models.list().data[0].id == MODEL


def test_completions_text_and_token_ids(client):
    a = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    ids = httpx.post(
        f"{client.base_url}completions",
        json={"prompt": [504, 3575, 282, 4649, 314], "max_tokens": 3, "temperature": 0},
    ).json()
    assert a.usage.prompt_tokens_details.cached_tokens is not None and a.choices[0].text
    assert ids["usage"]["prompt_tokens"] == 5 and len(ids["choices"]) == 1
    text = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, stream=True
        )
    )
    assert text == a.choices[0].text


def test_sigterm_drains_and_exits_zero(server):
    # Last test of the module (pytest keeps file order): the server is stopped here.
    r = httpx.get(f"{server.url}/debug/kv").json()
    assert r["ok"] and r["pages"]["request_pages"] == 0
    stream = httpx.stream(
        "POST", f"{server.base_url}/completions", timeout=60,
        json={"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "stream": True, "ignore_eos": True},
    )  # fmt: skip
    with stream as resp:
        lines = resp.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        assert server.proc is not None
        server.proc.send_signal(15)  # SIGTERM with a request in flight: it finishes, then the server exits
        rest = [line for line in lines if line.startswith("data:")]
    assert json.loads(first[5:])["choices"]
    assert rest[-1] == "data: [DONE]"
    assert server.terminate(timeout=30) == 0
    assert "Application shutdown complete" in server.log()
