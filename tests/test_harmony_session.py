"""Issue 31's acceptance: a 10-turn tool-using session through a real ``kvreuse serve`` on a tiny
random gpt-oss, with the official ``openai`` client.

Every turn is forced to call a tool, alternately ``tool_choice: "required"`` (the harmony call grammar
picks the tool, its name in the tokenizer's own pieces, and the arguments) and a named tool; every call must come back parsed, with ``finish_reason: "tool_calls"``, and
the generation must end at ``<|call|>``.  With the bundled template's append-only mode
(``keep_analysis``) each request extends the previous prompt + its output, so the tokens prefilled
per turn (``kvreuse.cache``: prompt - cached) are the new tokens (the tool result and the next
header) plus at most a page: the cache matches whole pages and never the sampled last token.
"""

from __future__ import annotations

import json

import openai
import pytest

from kvreuse.runtime.server.launcher import ServerProcess
from tests.harmony_model import TOOLS, make_gpt_oss

pytestmark = pytest.mark.timeout(300)
PAGE = 16
TURNS = 10
CHOICES = ["required", {"type": "function", "function": {"name": "get_time"}}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("harmony_serve")
    model = make_gpt_oss(root / "model")
    args = ["--model", str(model), "--chat-template", "gpt_oss", "--dtype", "float32", "--device", "cpu",
            "--page-size", str(PAGE), "--kv-cache-memory", "64M", "--served-model-name", "gpt-oss-tiny",
            "--max-model-len", "4096", "--shutdown-timeout", "5"]  # fmt: skip
    proc = ServerProcess(args, root / "server.log").start()
    yield proc
    proc.stop()


def test_ten_turn_tool_session_is_append_only(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=120)
    messages = [
        {"role": "system", "content": "You are a travel agent. Use the tools."},
        {"role": "user", "content": "Plan my trip: check the weather and the time, ten times."},
    ]
    rows, previous = [], None
    for turn in range(TURNS):
        r = client.chat.completions.create(
            model="gpt-oss-tiny", messages=messages, tools=TOOLS, tool_choice=CHOICES[turn % 2], max_tokens=24,
            temperature=0, reasoning_effort="low", extra_body={"chat_template_kwargs": {"keep_analysis": True}},
        )  # fmt: skip
        choice, cache = r.choices[0], r.model_extra["kvreuse"]["cache"]
        assert choice.finish_reason == "tool_calls", (turn, choice)
        [call] = choice.message.tool_calls
        assert call.function.name in {"get_weather", "get_time"}
        args = json.loads(call.function.arguments)
        assert set(args) == ({"day"} if call.function.name == "get_weather" else {"tz"})
        prompt, cached = cache["prompt_tokens"], cache["cached_tokens"]
        if previous is not None:
            new = prompt - (previous[0] + previous[1])  # beyond the last prompt and what it generated
            rows.append((turn, prompt, cached, prompt - cached, new, cache["cause"]))
        previous = (prompt, r.usage.completion_tokens)
        messages.append(
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]}
        )
        result = {"temp_c": 10 + turn} if call.function.name == "get_weather" else {"time": f"{turn:02d}:00"}
        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    print("\n(turn, prompt, cached, prefilled, new tokens, cause):", *rows, sep="\n")
    for turn, _, _, prefilled, new, cause in rows:
        assert cause == "append_only", rows
        assert new <= prefilled <= new + PAGE, (turn, rows)
