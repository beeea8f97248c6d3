"""The four workloads of ``kvreuse.benchmarks.serving.speculative``: a chat prompt and the reply to force, per variant.

The embedded 135M model would not reproduce any of these replies by itself, so every reply is
scripted (forced decoding, ``SamplingParams.forced_tokens``): the engine still runs every forward a
real reply costs, and a draft is accepted only where it equals the forced token, as it would be where
a larger model wrote that text.

1. ``rewrite``: the agent read a 150-line Python file (a tool result) and writes it back with 3 small
   edits (in its first 35 lines: the benchmark times the first ``--max-reply`` tokens of the reply);
2. ``tool_json``: after earlier tool calls, a tool call whose JSON repeats their arguments;
3. ``summary``: a summary that quotes sentences of a tool result;
4. ``chat``: free chat: a reply that shares nothing with the prompt but ordinary English.
"""

from __future__ import annotations

import json
import random
from typing import NamedTuple

WORKLOADS = ("rewrite", "tool_json", "summary", "chat")

_WORDS = (
    "alpha beta gamma delta user order item cache page token batch request session value count total "
    "index buffer record stream result config path name size limit offset score weight label state"
).split()

_SENTENCES = [
    "The deployment finished at 14:02 UTC after all 48 replicas reported healthy.",
    "Latency at the 99th percentile rose from 180 ms to 240 ms during the rollout window.",
    "Two requests failed with a timeout while the connection pool was being resized.",
    "The cache hit rate stayed above 92 percent for every tenant except the analytics team.",
    "Disk usage on the primary database grew by 3.1 GB, mostly from the audit log table.",
    "No customer-facing errors were recorded after the configuration change was reverted.",
    "The on-call engineer acknowledged the alert within four minutes of it firing.",
    "Memory on the worker nodes peaked at 71 percent during the nightly batch job.",
    "A retry storm from the billing service was throttled by the gateway's rate limiter.",
    "The new index reduced the median query time for order lookups from 35 ms to 6 ms.",
]

_CHAT_REPLY = (
    "Sure. A good way to start learning to paint with watercolors is to keep things simple. Buy a "
    "small set of student-grade paints, two round brushes and a pad of cold-pressed paper. Practice "
    "flat washes and gradients before you try a full picture, and let each layer dry before adding "
    "the next one. Painting the same small scene several times teaches you more than one ambitious "
    "piece, because you can see what changed. Above all, be patient with yourself: muddy colors and "
    "hard edges are part of learning, and they become rarer with every page you fill."
)


class Workload(NamedTuple):
    """A chat (OpenAI-style messages) and the reply text forced as the model's answer."""

    messages: list[dict]
    reply: str


def python_file(rng: random.Random, lines: int = 150) -> list[str]:
    """A plausible Python module of ``lines`` lines: small functions over varied names."""
    out = ['"""Helpers for the order service."""', "", "import math", ""]
    while len(out) < lines:
        a, b, c = rng.sample(_WORDS, 3)
        n = rng.randint(2, 9)
        out += [
            f"def {a}_{b}({c}, limit={n}):",
            f'    """Return the {b} of {c} within {a} limits."""',
            f"    if {c} is None:",
            f"        return {rng.randint(0, 99)}",
            f"    total = sum(x.{b} for x in {c}[:limit])",
            f"    return math.floor(total / max(len({c}), {n}))",
            "",
        ]
    return out[:lines]


def rewrite(rng: random.Random) -> Workload:
    src = python_file(rng)
    new = list(src)
    for i in rng.sample(range(5, 35), 3):  # three small edits, inside the replies the benchmark times
        new[i] = new[i].replace("limit", "cap") if "limit" in new[i] else new[i] + "  # checked"
    body = "\n".join(src)
    msgs = [
        {"role": "user", "content": "Rename `limit` to `cap` where it matters in orders.py."},
        {
            "role": "assistant",
            "content": "I'll read the file first.\n<tool_call>read_file orders.py</tool_call>",
        },
        {"role": "user", "content": f"<tool_result>\n{body}\n</tool_result>"},
    ]
    return Workload(msgs, "Here is the updated file:\n```python\n" + "\n".join(new) + "\n```")


def tool_json(rng: random.Random) -> Workload:
    calls = []
    msgs = [
        {"role": "user", "content": "Check the orders of our three biggest customers and refund late ones."}
    ]
    for k in range(3):
        args = {
            "customer_id": f"cus_{rng.randint(10**7, 10**8)}",
            "status": rng.choice(["late", "shipped", "open"]),
            "fields": rng.sample(_WORDS, 5),
            "window": {"from": "2026-11-01", "to": "2026-11-30"},
            "limit": 50,
        }
        calls.append(args)
        call = json.dumps({"name": "list_orders", "arguments": args}, indent=2)
        msgs += [
            {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
            {
                "role": "user",
                "content": f"<tool_result>{k + 2} orders, ids {rng.randint(1000, 9999)}..</tool_result>",
            },
        ]
    refund = json.dumps(
        {"name": "refund_orders", "arguments": {**calls[0], "reason": "late delivery"}}, indent=2
    )
    again = json.dumps({"name": "list_orders", "arguments": calls[1]}, indent=2)
    return Workload(msgs, f"<tool_call>\n{refund}\n</tool_call>\n<tool_call>\n{again}\n</tool_call>")


def summary(rng: random.Random) -> Workload:
    report = rng.sample(_SENTENCES, len(_SENTENCES))
    msgs = [
        {"role": "user", "content": "Summarise yesterday's incident report for the team channel."},
        {"role": "user", "content": "<tool_result>\n" + " ".join(report) + "\n</tool_result>"},
    ]
    quoted = rng.sample(report, 5)
    reply = "Summary of the incident report:\n" + "\n".join(f'- "{s}"' for s in quoted)
    return Workload(msgs, reply + "\nOverall the rollout recovered without customer impact.")


def chat(rng: random.Random) -> Workload:
    msgs = [{"role": "user", "content": "How should a beginner start with watercolor painting?"}]
    return Workload(msgs, _CHAT_REPLY)


def make(name: str, seed: int) -> Workload:
    return {"rewrite": rewrite, "tool_json": tool_json, "summary": summary, "chat": chat}[name](
        random.Random(seed)
    )
