"""What the gateway tests share: fast-failover gateway settings and the session that outlives its replica."""

from __future__ import annotations

import httpx
from openai import OpenAI

# SMG drops a worker after one failed health check a second, and retries a request elsewhere
FAST_FAILOVER = [
    "--health-check-interval-secs",
    "1",
    "--health-failure-threshold",
    "1",
    "--retry-max-retries",
    "3",
]


def served_by(urls: list[str], headers: dict[str, str] | None = None) -> list[int]:
    """Requests each replica has finished (its own /metrics), -1 for a dead one."""
    out = []
    for url in urls:
        try:
            text = httpx.get(url + "/metrics", headers=headers or {}, timeout=5).text
        except httpx.HTTPError:
            out.append(-1)
            continue
        line = next(x for x in text.splitlines() if x.startswith("kvreuse_requests_total"))
        out.append(int(float(line.split()[-1])))
    return out


def session_survives_its_replica(
    cluster, client: OpenAI, page: int, headers: dict[str, str] | None = None
) -> list:
    """An agent session's two turns through a 2-replica cluster land on one replica, which is then
    SIGKILLed; the third turn runs on the other and reads >= 90% of the previous prompt from the
    shared tier.  Returns the session's messages as the third turn sent them."""
    system = {
        "role": "system",
        "content": "You are a careful coding agent. " + "Follow the repository rules. " * 30,
    }
    messages = [system, {"role": "user", "content": "List the files in src/ and explain each one."}]

    def turn() -> dict:
        r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
        messages.append({"role": "user", "content": f"Now look at file number {len(messages)}."})
        return r.model_dump()

    before = served_by(cluster.urls, headers)
    first, second = turn(), turn()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["prompt_tokens"] // page * page - page
    after = served_by(cluster.urls, headers)
    owner = max(range(2), key=lambda i: after[i] - before[i])
    assert after[owner] - before[owner] == 2  # cache-aware: both turns on one replica

    cluster.kill_replica(owner)
    third = turn()  # the gateway routes it to the survivor (or retries there)
    tiers = third["kvreuse"]["cache"]["cached_by_tier"]
    assert tiers["shared"] >= 0.9 * second["usage"]["prompt_tokens"], tiers  # read, not recomputed
    cached = third["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert tiers["pool"] + tiers["host"] + tiers["disk"] + tiers["shared"] == cached
    assert served_by(cluster.urls, headers)[1 - owner] == after[1 - owner] + 1
    return messages[:-2]
