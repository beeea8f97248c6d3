"""``kvreuse top --once`` against a real ``kvreuse serve`` (tiny model, API keys on): the figures it
prints are the server's, the session is listed, and every failure is one line with exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from kvreuse.runtime.server.launcher import ServerProcess, free_port
from tests.helpers import make_tiny_model

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]
PROMPT = " ".join(f"word{i}" for i in range(80))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("top")
    model = make_tiny_model(d / "m", vocab=49152)
    args = ["--model", str(model), "--dtype", "float32", "--kv-cache-memory", "4M", "--api-key", "k1"]
    args += ["--operator-key", "op"]  # /metrics is the operator's with keys on: top runs with that key
    args += ["--eviction-shadows", "lru"]
    proc = ServerProcess(args, d / "server.log").start()
    yield proc
    proc.stop()


def _top(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "160", "KVREUSE_API_KEY": ""}
    cmd = [sys.executable, "-m", "kvreuse.runtime.cli.main", "top", "--once", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)


def test_top_once_shows_the_servers_figures(server):
    headers = {"Authorization": "Bearer op"}  # the operator's own session, so its top lists the pin
    for _ in range(2):  # the second hits the first's prefix
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 3,
            "user": "sess-7",
        }
        r = httpx.post(f"{server.base_url}/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
    cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    metrics = httpx.get(f"{server.url}/metrics", headers=headers, timeout=60).text
    value = {x.split()[0]: float(x.split()[1]) for x in metrics.splitlines() if x and not x.startswith("#")}
    prompt, pages = value["kvreuse_prompt_tokens_total"], int(value["kvreuse_kv_pages_total"])
    out = _top("--url", server.url, "--api-key", "op")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "requests" in text and " 2 " in text.split("requests")[1].splitlines()[0]
    assert f"{cached:,}" in text and f"{cached / prompt:.1%}" in text
    assert "sess-7" in text and "append_only" in text and "new_conversation" in text
    assert f"/ {pages:,} pages" in text
    shadow = value["kvreuse_eviction_shadow_prompt_tokens_total"]
    served = value["kvreuse_eviction_shadow_served_tokens_total"] / shadow
    lru = value['kvreuse_eviction_shadow_cached_tokens_total{policy="lru"}'] / shadow
    assert shadow == prompt and f"served {served:.1%}  lru {lru:.1%}" in text


def test_top_failures_are_one_line(server):
    for args, needle in (
        (("--url", server.url), "needs an API key"),
        (("--url", server.url, "--api-key", "wrong"), "needs an API key"),
        (("--url", server.url, "--api-key", "k1"), "needs the server's operator key"),
        (("--url", f"http://127.0.0.1:{free_port()}"), "cannot reach"),
        (("--url", server.url, "--interval", "0"), "--interval must be > 0"),
    ):
        out = _top(*args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr, out.stderr
