"""Issue 35: the Responses API on a real ``kvreuse serve`` (the embedded model) through the official
``openai`` client and the OpenAI Agents SDK's default provider, and the parallel-call controls on
chat completions, Responses and Anthropic Messages.

The stateful claim is measured exactly: a turn naming ``previous_response_id`` has
``cached_tokens`` == the previous response's whole sequence (prompt + output) in whole pages.  The
last sampled token of a response was never fed to the model, so its KV does not exist: the pages
cover ``total_tokens - 1`` tokens, rounded down to the page.
"""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import openai
import pytest

from kvreuse.runtime.server.launcher import ServerProcess

pytestmark = pytest.mark.timeout(600)

MODEL = "smol"
PAGE = 16
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather for a city.",
          "parameters": WEATHER}]  # fmt: skip
INSTRUCTIONS = "You are a travel agent. Check the weather for every city the user names, one call at a time."
FIRST = [
    {
        "role": "user",
        "content": "Plan my trip to Paris, Rome, Oslo, Lima, Cairo and Tokyo: check the weather.",
    }
]
LOOP = dict(model=MODEL, instructions=INSTRUCTIONS, tools=TOOLS, tool_choice="required",
            parallel_tool_calls=False, max_output_tokens=40, temperature=0)  # fmt: skip


def whole_pages(tokens: int) -> int:
    return tokens // PAGE * PAGE


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    args = ["--kv-cache-memory", "256M", "--served-model-name", MODEL, "--max-running", "8",
            "--page-size", str(PAGE), "--shutdown-timeout", "5"]  # fmt: skip
    proc = ServerProcess(args, log).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=300)


def _outputs(k: int, resp) -> list[dict]:
    return [
        {"type": "function_call_output", "call_id": o.call_id, "output": json.dumps({"temp_c": 10 + k})}
        for o in resp.output
        if o.type == "function_call"
    ]


def _create(client, stream: bool, **kwargs):
    """A response, streamed or not; streamed: through the client's ``responses.stream`` helper (its
    accumulator reads every event), and the event order is checked."""
    if not stream:
        return client.responses.create(**kwargs)
    kinds, final = [], None
    with client.responses.stream(**kwargs) as events:  # the client's own accumulator checks the ids
        for event in events:
            kinds.append(event.type)
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
    assert kinds[:2] == ["response.created", "response.in_progress"] and final is not None, kinds
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") >= 1
    return final


def _calls(resp) -> list[tuple[str, str]]:
    return [(o.name, o.arguments) for o in resp.output if o.type == "function_call"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_six_turn_tool_loop_continues_the_stored_sequence(client, stream):
    first = [{**FIRST[0], "content": FIRST[0]["content"] + (" (streamed)" if stream else "")}]
    prev, figures = None, []
    for k in range(6):
        inp = first if prev is None else _outputs(k - 1, prev)
        resp = _create(client, stream, input=inp, previous_response_id=prev.id if prev else None, **LOOP)
        assert resp.status == "completed" and len(_calls(resp)) == 1, resp.output
        cached = resp.usage.input_tokens_details.cached_tokens
        figures.append((resp.usage.input_tokens, cached, resp.usage.total_tokens))
        if prev is not None:  # the previous response's whole sequence, in whole pages
            assert cached == whole_pages(prev.usage.total_tokens - 1), figures
        prev = resp
    print(f"\n(input, cached, total) per turn, stream={stream}: {figures}")
    stored = client.responses.retrieve(prev.id)
    assert stored.id == prev.id and _calls(stored) == _calls(prev)


def test_history_resent_as_items_gives_the_same_tokens(client):
    """The same loop without previous_response_id (the client resends every item): the same prompts
    token for token (run after the stateful loop, each prompt is cached in all its whole pages, which
    it can only be if its tokens are the stateful prompt's) and the same outputs."""
    first = [{**FIRST[0], "content": FIRST[0]["content"] + " (items)"}]
    prev, stateful = None, []
    for k in range(6):
        inp = first if prev is None else _outputs(k - 1, prev)
        prev = client.responses.create(input=inp, previous_response_id=prev.id if prev else None, **LOOP)
        stateful.append((prev.usage.input_tokens, _calls(prev)))
    items, resent = list(first), []
    for k in range(6):
        resp = client.responses.create(input=items, store=False, **LOOP)
        resent.append((resp.usage.input_tokens, _calls(resp)))
        assert resp.usage.input_tokens_details.cached_tokens == whole_pages(resp.usage.input_tokens - 1)
        items += [o.model_dump(exclude_none=True) for o in resp.output] + _outputs(k, resp)
    assert resent == stateful


def test_store_false_keeps_nothing_and_delete_forgets(client, server):
    resp = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=3, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(
            model=MODEL, input="Again.", previous_response_id=resp.id, max_output_tokens=2
        )
    assert e.value.body["code"] == "previous_response_not_found"
    long = "Say hi to " + ", ".join(f"friend {i}" for i in range(40)) + "."  # whole pages to pin
    kept = client.responses.create(model=MODEL, input=long, max_output_tokens=3, metadata={"k": "v"})
    assert client.responses.retrieve(kept.id).metadata == {"k": "v"}
    pins = httpx.get(f"{server.base_url}/cache").json()
    assert [p["pinned_tokens"] for p in pins["sessions"] if p["id"] == kept.id] == [
        whole_pages(kept.usage.total_tokens - 1)
    ], pins
    deleted = httpx.delete(f"{server.base_url}/responses/{kept.id}")
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    pins = httpx.get(f"{server.base_url}/cache").json()
    assert kept.id not in json.dumps(pins)


def test_cancel_stops_a_streamed_response(server):
    body = {"model": MODEL, "input": "Write a very long story.", "max_output_tokens": 2000, "temperature": 0,
            "stream": True, "store": True}  # fmt: skip
    events: list[dict] = []
    started = threading.Event()

    def read() -> None:
        with httpx.stream("POST", f"{server.base_url}/responses", json=body, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    if events[-1]["type"] == "response.output_text.delta":
                        started.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert started.wait(120)
    rid = events[0]["response"]["id"]
    r = httpx.post(f"{server.base_url}/responses/{rid}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
    reader.join(120)
    last = events[-1]
    assert last["type"] == "response.failed" and last["response"]["status"] == "cancelled"
    assert last["response"]["usage"]["output_tokens"] < 2000
    assert (
        httpx.get(f"{server.base_url}/responses/{rid}").status_code == 404
    )  # a cancelled response is not kept


def test_input_tokens_counts_the_prompt_that_runs(client, server):
    body = {"model": MODEL, "input": "Count me.", "instructions": "Be brief."}
    counted = httpx.post(f"{server.base_url}/responses/input_tokens", json=body).json()
    resp = client.responses.create(**body, max_output_tokens=1)
    assert counted == {"object": "response.input_tokens", "input_tokens": resp.usage.input_tokens}


def test_json_schema_text_format_is_decoded_by_the_grammar(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fmt = {"format": {"type": "json_schema", "name": "place", "schema": schema}}
    resp = client.responses.create(
        model=MODEL, input="Name a city.", text=fmt, max_output_tokens=30, temperature=0
    )
    assert set(json.loads(resp.output_text)) == {"city"}


@pytest.mark.parametrize(
    "body, says",
    [
        ({"input": "x", "tools": [{"type": "file_search"}]}, "tool type 'file_search' is not supported"),  # web_search: left out (Codex CLI)
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
         "input_image content parts are not supported"),
        ({"input": "x", "stream_options": {"include_obfuscation": False}}, "stream_options is only allowed"),
        ({"input": "x", "background": True}, "background responses are not supported"),
        ({"input": [{"role": "user", "content": [{"type": {"not": "a string"}}]}]}, "input"),
        ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "1"}]}, "no earlier function_call"),
    ],
)  # fmt: skip
def test_clear_400s(server, body, says):
    r = httpx.post(f"{server.base_url}/responses", json={"model": MODEL, **body})
    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text


def test_chat_completions_refuses_images_and_stream_options_without_stream(server):
    url = f"{server.base_url}/chat/completions"
    image = [{"type": "image_url", "image_url": {"url": "data:,"}}]
    r = httpx.post(url, json={"model": MODEL, "messages": [{"role": "user", "content": image}]})
    assert (
        r.status_code == 400 and "image_url content parts are not supported" in r.json()["error"]["message"]
    )
    odd = [{"type": {"not": "a string"}, "text": "x"}]  # once a 500: a dict is not hashable
    assert (
        httpx.post(url, json={"model": MODEL, "messages": [{"role": "user", "content": odd}]}).status_code
        == 400
    )
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "stream_options": {"include_usage": True},
    }
    r = httpx.post(url, json=body)
    assert r.status_code == 400 and "stream_options is only allowed when stream is true" in r.text


# -- the OpenAI Agents SDK's default provider (the Responses API) ----------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_agents_sdk_default_provider_runs_a_tool_loop(server, stream):
    agents = pytest.importorskip("agents")
    calls: list[str] = []
    tag = " (streamed)" if stream else ""  # the streamed loop's own prompts: none of its pages cached before

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        calls.append(city)
        return json.dumps({"city": city, "temp_c": 11})

    async def run(agent, text: str, previous: str | None):
        if not stream:
            return await agents.Runner.run(agent, text, previous_response_id=previous, max_turns=4)
        result = agents.Runner.run_streamed(agent, text, previous_response_id=previous, max_turns=4)
        async for _ in result.stream_events():
            pass
        return result

    async def main():
        agents.set_tracing_disabled(True)
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=300)
        agents.set_default_openai_client(client, use_for_tracing=False)
        settings = agents.ModelSettings(tool_choice="required", max_tokens=150, temperature=0)
        agent = agents.Agent(name="travel", instructions="You check the weather.", model=MODEL,
                             tools=[get_weather], model_settings=settings)  # fmt: skip
        first = await run(agent, "Weather in Paris?" + tag, None)
        second = await run(agent, "And Rome?" + tag, first.last_response_id)
        return first, second

    first, second = asyncio.run(main())
    assert first.final_output and second.final_output and "Paris" in calls and "Rome" in calls, calls
    last = first.raw_responses[-1].usage
    cached = second.raw_responses[0].usage.input_tokens_details.cached_tokens
    assert cached == whole_pages(last.total_tokens - 1)
    print(
        f"\nAgents SDK stream={stream}: first run's last total {last.total_tokens}, next turn cached {cached}"
    )
