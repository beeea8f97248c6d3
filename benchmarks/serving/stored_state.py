"""Issue 51's measured runs against a real ``kvreuse serve`` (the embedded SmolLM2-135M, fp32, CPU).

``python -m kvreuse.benchmarks.serving.stored_state --phase load|flood [--seconds S] [--out PATH]`` (through
``../shared/tools/heavy`` on a shared machine).

* ``load``: 64 concurrent streaming clients (8 tenants, chat completions, half greedy and half seeded
  sampling at temperature 0.8, speculation as the server defaults) for ``--seconds``; each stream is
  cut by its client after a random number of chunks with probability 0.3.  Counted: statuses (5xx
  apart), streams whose text differs from the same request answered alone before the load (answers
  unchanged), and after the load the pool's pages still held by requests (``/debug/kv``: leaked
  pages; its integrity check too).
* ``flood``: tenant B stores 4,200 responses (``store: true``) as fast as the server takes them while
  tenant A runs a stored conversation (``previous_response_id``) turn after turn.  Counted: A's
  turns and their latency, any of A's responses gone (404), 5xx, B's responses kept, and the records
  file's size against its share of ``--kv-store-size``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from kvreuse.benchmarks.common import base_parser, bench_main, median, percentile, progress

TENANTS = [f"key-t{i}" for i in range(8)]
OPERATOR = "key-op"
PROMPTS = [f"Write one sentence about the number {i} and the colour {c}." for i, c in
           zip(range(8), ["red", "blue", "green", "amber", "teal", "grey", "pink", "gold"])]  # fmt: skip


def _server(work: Path, extra: list[str]):
    from kvreuse.runtime.server.launcher import ServerProcess  # benchmarks drive a server process

    keys = work / "keys"
    keys.write_text("\n".join([f"{k} {k[4:]}" for k in TENANTS] + [f"{OPERATOR} @operator"]) + "\n")
    flags = ["--dtype", "float32", "--kv-cache-memory", "256M", "--api-key-file", str(keys), *extra]
    return ServerProcess(flags, work / "server.log").start(timeout=600)


def _body(i: int, sampled: bool) -> dict:
    b = {"model": "x", "messages": [{"role": "user", "content": PROMPTS[i]}], "max_tokens": 24}
    return {**b, "temperature": 0.8, "seed": 1000 + i} if sampled else {**b, "temperature": 0}


async def _stream(
    c: httpx.AsyncClient, url: str, key: str, body: dict, cut: int | None
) -> tuple[int, str | None]:
    """(status, the streamed text, or None when the client cut it or it ended in an error event)."""
    text, chunks = [], 0
    async with c.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True},
                        headers={"Authorization": f"Bearer {key}"}) as r:  # fmt: skip
        if r.status_code != 200:
            await r.aread()
            return r.status_code, None
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks += 1
            if cut is not None and chunks >= cut:
                return 200, None  # the client goes away mid-stream
            import json

            ev = json.loads(line[6:])
            if "error" in ev:
                return 200, None
            for ch in ev.get("choices", []):
                text.append(ch.get("delta", {}).get("content") or "")
    return 200, "".join(text)


async def _load(url: str, seconds: float, clients: int) -> dict:
    model = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {OPERATOR}"}).json()["data"][0][
        "id"
    ]
    ref: dict[tuple[int, bool], str] = {}
    async with httpx.AsyncClient(timeout=600) as c:
        for i in range(len(PROMPTS)):  # the answers alone, before the load
            for sampled in (False, True):
                st, text = await _stream(c, url, TENANTS[0], {**_body(i, sampled), "model": model}, None)
                assert st == 200 and text is not None, st
                ref[(i, sampled)] = text
    statuses: Counter = Counter()
    stats = Counter()
    rng = random.Random(51)
    end = time.monotonic() + seconds

    async def client(n: int) -> None:
        key = TENANTS[n % len(TENANTS)]
        async with httpx.AsyncClient(timeout=300) as c:
            while time.monotonic() < end:
                i, sampled = rng.randrange(len(PROMPTS)), rng.random() < 0.5
                cut = rng.randint(1, 20) if rng.random() < 0.3 else None
                try:
                    st, text = await _stream(c, url, key, {**_body(i, sampled), "model": model}, cut)
                except httpx.HTTPError as e:
                    statuses[type(e).__name__] += 1
                    continue
                statuses[st] += 1
                if cut is not None:
                    stats["cut"] += 1
                elif text is not None:
                    stats["complete"] += 1
                    stats["changed"] += text != ref[(i, sampled)]
                elif st == 200:
                    stats["error_event"] += 1

    t0 = time.monotonic()
    await asyncio.gather(*(client(n) for n in range(clients)))
    wall = time.monotonic() - t0
    await asyncio.sleep(2.0)  # cut streams' aborts reach the engine
    op = {"Authorization": f"Bearer {OPERATOR}"}
    kv = httpx.get(f"{url}/debug/kv", headers=op, timeout=120).json()
    return {
        "clients": clients, "seconds": round(wall, 1), "statuses": {str(k): v for k, v in statuses.items()},
        "responses_5xx": sum(v for k, v in statuses.items() if isinstance(k, int) and k >= 500),
        "streams": dict(stats), "answers_changed": stats["changed"],
        "after": {"integrity_ok": kv["ok"], "request_pages_leaked": kv["stats"]["request_pages"],
                  "running": kv["stats"]["running"], "waiting": kv["stats"]["waiting"],
                  "in_flight": kv["in_flight"]},
    }  # fmt: skip


def _flood(url: str, work: Path, n: int) -> dict:
    a_key, b_key = TENANTS[0], TENANTS[1]
    model = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {OPERATOR}"}).json()["data"][0][
        "id"
    ]
    statuses: Counter = Counter()
    done = asyncio.Event()
    a_lat: list[float] = []
    a_ids: list[str] = []
    b_ids: list[str] = []
    lost: Counter = Counter()

    async def flooder() -> None:
        sem = asyncio.Semaphore(16)
        async with httpx.AsyncClient(timeout=600, headers={"Authorization": f"Bearer {b_key}"}) as c:

            async def one(k: int) -> None:
                async with sem:
                    body = {"model": model, "input": f"flood {k}", "max_output_tokens": 1, "store": True}
                    r = await c.post(f"{url}/v1/responses", json=body)
                    statuses[f"B {r.status_code}"] += 1
                    if r.status_code == 200:
                        b_ids.append(r.json()["id"])
                    if k % 500 == 0:
                        progress(f"flood: {k} of {n}; A turns {len(a_ids)}; statuses {dict(statuses)}")

            await asyncio.gather(*(one(k) for k in range(n)))
        done.set()

    async def worker() -> None:
        prev = None
        async with httpx.AsyncClient(timeout=600, headers={"Authorization": f"Bearer {a_key}"}) as c:
            turn = 0
            while not done.is_set():
                body = {"model": model, "input": f"Turn {turn}: say something short.", "max_output_tokens": 8,
                        "temperature": 0, "store": True, "previous_response_id": prev}  # fmt: skip
                t0 = time.perf_counter()
                try:
                    r = await c.post(f"{url}/v1/responses", json=body, timeout=300)
                except httpx.TimeoutException:  # counted, not fatal: the run still counts A's losses
                    statuses["A 0-timeout"] += 1
                    continue
                a_lat.append(time.perf_counter() - t0)
                statuses[f"A {r.status_code}"] += 1
                if r.status_code == 200:
                    prev = r.json()["id"]
                    a_ids.append(prev)
                turn += 1
            for rid in a_ids:  # every one of A's responses is still there after B's flood
                g = await c.get(f"{url}/v1/responses/{rid}")
                if g.status_code != 200:
                    lost[g.status_code] += 1

    async def both() -> None:
        await asyncio.gather(flooder(), worker())

    t0 = time.monotonic()
    asyncio.run(both())
    wall = time.monotonic() - t0
    with httpx.Client(timeout=600, headers={"Authorization": f"Bearer {b_key}"}) as c:
        b_alive = [c.get(f"{url}/v1/responses/{rid}").status_code == 200 for rid in b_ids]
        b_kept = sum(b_alive[-200:])
    files = list(work.glob("store/responses-*.jsonl"))
    return {
        "flood": n, "seconds": round(wall, 1), "statuses": dict(statuses),
        "responses_5xx": sum(v for k, v in statuses.items() if int(k.split()[1].split("-")[0]) >= 500),
        "a_turns": len(a_ids), "a_lost": dict(lost),
        "a_latency_s": {"p50": round(median(a_lat), 3), "p99": round(percentile(a_lat, 99), 3)} if a_lat else None,
        "b_newest_200_kept": b_kept, "b_kept": sum(b_alive), "b_lost": len(b_alive) - sum(b_alive),
        "records_file_bytes": files[0].stat().st_size if files else None,
    }  # fmt: skip


def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="stored-state-"))
    if args.phase == "load":
        srv = _server(work, ["--max-running", "16", "--max-waiting", "96"])
        try:
            return {
                "phase": "load",
                "dtype": "fp32",
                **asyncio.run(_load(srv.url, args.seconds, args.clients)),
            }
        finally:
            srv.stop()
    store_size = "200M"
    srv = _server(work, ["--kv-store", str(work / "store"), "--kv-store-size", store_size,
                         "--max-running", "16", "--max-waiting", "96"])  # fmt: skip
    try:
        out = _flood(srv.url, work, args.flood)
    finally:
        srv.stop()
    return {"phase": "flood", "dtype": "fp32", "kv_store_size": store_size,
            "records_budget_bytes": int(200 * (1 << 20) * 0.05), **out}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("stored_state", __doc__.splitlines()[0])
    p.add_argument("--phase", choices=["load", "flood"], default="load")
    p.add_argument("--seconds", type=float, default=120.0, help="the load's length (default 120 s)")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--flood", type=int, default=4200, help="tenant B's stored responses (default 4,200)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return bench_main("stored_state", parse_args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
