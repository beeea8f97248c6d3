"""Growing agent conversations used by the prefix-stability check (plain, tools, reasoning)."""

from __future__ import annotations

import json
from typing import NamedTuple


class Conversation(NamedTuple):
    """A named conversation; every assistant message stands for one model generation."""

    name: str
    messages: list[dict]
    tools: list[dict] | None = None


WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"],
            },
        },
    }
]


def _call(call_id: str, city: str) -> dict:
    args = json.dumps({"city": city})
    return {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": args}}


def default_conversations() -> list[Conversation]:
    """Plain turns, tool turns (single and parallel calls), reasoning turns, reasoning with tools."""
    system = {"role": "system", "content": "You are a concise assistant."}
    plain = [
        system,
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "7 is prime."},
        {"role": "user", "content": "And an even one?"},
        {"role": "assistant", "content": "2 is the only even prime."},
        {"role": "user", "content": "Thanks."},
    ]
    tools = [
        system,
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [_call("call_1", "Paris")]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
        {"role": "assistant", "content": "It is 21 C in Paris."},
        {"role": "user", "content": "And in Rome?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [_call("call_2", "Rome")]},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"temp_c": 25}'},
        {"role": "assistant", "content": "It is 25 C in Rome."},
        {"role": "user", "content": "Good."},
    ]
    reasoning = [
        system,
        {"role": "user", "content": "What is 12 * 7?"},
        {"role": "assistant", "reasoning_content": "12 * 7 = 84.", "content": "84."},
        {"role": "user", "content": "Divide that by 4."},
        {"role": "assistant", "reasoning_content": "84 / 4 = 21.", "content": "21."},
        {"role": "user", "content": "Thanks."},
    ]
    reasoning_tools = [
        {"role": "user", "content": "Is it warm in Oslo?"},
        {
            "role": "assistant",
            "reasoning_content": "I should look it up.",
            "content": "",
            "tool_calls": [_call("call_3", "Oslo")],
        },
        {"role": "tool", "tool_call_id": "call_3", "content": '{"temp_c": 9}'},
        {"role": "assistant", "reasoning_content": "9 C is cool.", "content": "No, 9 C."},
        {"role": "user", "content": "Thanks."},
    ]
    return [
        Conversation("plain", plain),
        Conversation("tools", tools, WEATHER_TOOLS),
        Conversation("reasoning", reasoning),
        Conversation("reasoning+tools", reasoning_tools, WEATHER_TOOLS),
    ]


def without_reasoning(conv: Conversation) -> Conversation:
    """The conversation as a model with thinking disabled would have produced it."""
    keys = ("reasoning_content", "thinking", "reasoning")
    return conv._replace(messages=[{k: v for k, v in m.items() if k not in keys} for m in conv.messages])
