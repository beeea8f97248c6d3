"""``kvreuse cluster`` left alone keeps serving: every part killed, including during its restart.

The command runs as an operator runs it (a subprocess; its processes found by their command lines,
so the test also runs against a version that writes no ``cluster.json``).  Replica 0 is SIGKILLed and
killed again while it is being started: the cluster must retry it and keep serving (before, the
restart's error escaped the loop and the command stopped every part, rc 2).  The restarted replica
gets new sessions again.  Valkey demands its password, and SIGKILLed is started again on its port
(before, it stayed down).  The shared tier's background check (an idle replica's ``/health``
follows the store down and back: before, only a request reaching past the pool did) is tested on a
Valkey server of its own.  The gateway is SIGKILLed and comes back on its port.  The
operator commands scrape and reset every replica; SIGTERM stops everything.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from kvreuse.runtime.cluster.cluster import GATEWAY_DEFAULTS, with_defaults
from kvreuse.runtime.cluster.services import ServiceError, free_port
from kvreuse.runtime.cluster.supervisor import Backoff, Supervisor, Watch
from tests.helpers import make_tiny_model

PS = 16


class Part:
    """A part whose restart fails ``fail`` times (a replica that dies again while loading)."""

    def __init__(self, fail: int = 0) -> None:
        self.up, self.fail, self.tries = True, fail, 0

    def restart(self) -> None:
        self.tries += 1
        if self.tries <= self.fail:
            raise ServiceError("replica 0 exited with -9; see replica0.log")
        self.up = True


def test_a_part_that_fails_to_restart_is_retried_with_backoff_and_the_others_still_supervised():
    flaky, other = Part(fail=3), Part()
    lines: list[str] = []
    sup = Supervisor([Watch("replica 0", lambda: flaky.up, flaky.restart), Watch("gateway", lambda: other.up, other.restart)],
                     lines.append, Backoff(0.05, 0.1), interval_s=0.01)  # fmt: skip
    sup.start()
    flaky.up = other.up = False
    deadline = time.monotonic() + 10
    while not (flaky.up and other.up) and time.monotonic() < deadline:
        time.sleep(0.01)
    sup.stop()
    sup.join()
    assert flaky.up and other.up and flaky.tries == 4 and other.tries == 1
    failed = [x for x in lines if x.startswith("replica 0 failed to restart")]
    assert [re.search(r"\((\d)x\)", x)[1] for x in failed] == ["1", "2", "3"]
    assert [x.rsplit("next try in ", 1)[1] for x in failed] == [
        "0.05 s",
        "0.1 s",
        "0.1 s",
    ]  # doubling, capped
    assert any(x.startswith("replica 0 is back after") for x in lines)
    assert sup.watches[0].state.restarts == 1 and sup.watches[0].state.failures == 0


def test_gateway_defaults_are_the_benchmarked_ones_and_a_given_flag_replaces_its_default():
    assert with_defaults(GATEWAY_DEFAULTS, []) == GATEWAY_DEFAULTS
    args = with_defaults(GATEWAY_DEFAULTS, ["--cache-threshold", "0.3", "--retry-max-retries", "3"])
    assert args.count("--cache-threshold") == 1 and args[args.index("--cache-threshold") + 1] == "0.3"
    assert args[args.index("--balance-abs-threshold") + 1] == "2"
    assert args[args.index("--health-check-interval-secs") + 1] == "1"


def _children(proc: subprocess.Popen, pattern: str) -> list[psutil.Process]:
    out = []
    for p in psutil.Process(proc.pid).children(recursive=True):
        try:
            if re.search(pattern, " ".join(p.cmdline())):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _wait(what: str, check, timeout_s: float, proc: subprocess.Popen):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        assert proc.poll() is None, f"kvreuse cluster exited ({proc.returncode}) waiting for {what}"
        try:
            if out := check():
                return out
        except (httpx.HTTPError, psutil.Error, OSError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def _status(url: str) -> str:
    return httpx.get(url + "/health", timeout=3).json()["status"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_cluster_survives_each_part_killed_even_during_its_restart(tmp_path):
    model = make_tiny_model(tmp_path / "m", vocab=49152)
    port, work = free_port(), tmp_path / "run"
    work.mkdir()
    serve = ["--model", str(model), "--dtype", "float32", "--page-size", str(PS), "--served-model-name", "tiny",
             "--kv-cache-memory", "8M", "--no-ui"]  # fmt: skip
    log = open(tmp_path / "cluster.out", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "kvreuse.runtime.cli.main", "cluster", "--replicas", "2",
                             "--port", str(port), "--workdir", str(work), "--", *serve],
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    gw = f"http://127.0.0.1:{port}"
    try:
        line = _wait("the cluster's ready line", lambda: re.search(r"over 2 replicas: (\S+) (\S+);", (tmp_path / "cluster.out").read_text()), 300, proc)  # fmt: skip
        urls = [line[1], line[2]]
        rport = urls[0].rsplit(":", 1)[1]

        def replica0() -> list[psutil.Process]:
            return _children(proc, rf"cli\.main serve .*--port {rport}\b")

        # replica 0 killed, then killed again while its new process loads
        (first,) = replica0()
        first.kill()
        second = _wait(
            "replica 0's restart", lambda: [p for p in replica0() if p.pid != first.pid], 60, proc
        )[0]
        second.kill()
        _wait("replica 0 serving again", lambda: _status(urls[0]) in ("ok", "degraded"), 180, proc)
        time.sleep(3)  # two health checks a second apart: the gateway takes it back
        assert proc.poll() is None

        # new sessions reach the restarted replica again
        routed = []
        for s in range(6):
            body = {"model": "tiny", "max_tokens": 2, "temperature": 0,
                    "messages": [{"role": "user", "content": f"Session {s}: " + f"review module {s} " * 40}]}  # fmt: skip
            r = httpx.post(gw + "/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            routed.append(r.headers.get("x-smg-routed-worker-id"))
        metrics = httpx.get(urls[0] + "/metrics", timeout=5).text
        served0 = float(re.search(r"^kvreuse_requests_total (\S+)", metrics, re.M)[1])
        assert served0 >= 1, routed
        assert all(routed) and len(set(routed)) == 2, routed  # the header names the replica; both served

        # Valkey: password required; killed, an idle replica says degraded, then ok once it is back
        (valkey,) = _children(proc, r"^\S*valkey-server ")
        vport = int(re.search(r":(\d+)", valkey.cmdline()[0])[1])  # Valkey's process title: binary host:port
        with pytest.raises(Exception, match="(?i)auth"):
            import valkey as vk

            vk.Valkey("127.0.0.1", vport, socket_timeout=2).get("x")
        valkey.kill()
        _wait(
            "Valkey restarted",
            lambda: [p for p in _children(proc, r"^\S*valkey-server ") if p.pid != valkey.pid],
            30,
            proc,
        )
        _wait("replicas ok again", lambda: _status(urls[0]) == _status(urls[1]) == "ok", 30, proc)

        # the gateway comes back on its port
        (smg,) = _children(proc, r"^smg")  # SMG names its process smg::router
        smg.kill()
        _wait("the gateway back", lambda: httpx.get(gw + "/workers", timeout=2).status_code == 200, 90, proc)
        body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hello again"}]}
        _wait("a chat through the new gateway", lambda: httpx.post(gw + "/v1/chat/completions", json=body, timeout=60).status_code == 200, 30, proc)  # fmt: skip

        # the operator's views of every replica; a reset through the gateway reaches both
        r = httpx.post(gw + "/flush_cache", timeout=60)
        assert r.status_code == 200 and r.json()["workers_flushed"] == 2, r.text
        out = subprocess.run([sys.executable, "-m", "kvreuse.runtime.cli.main", "cluster", "metrics", "--workdir", str(work)],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert re.search(r'^kvreuse_requests_total\{replica="0"\} [1-9]', out.stdout, re.M), out.stdout[:2000]
        assert 'kvreuse_cluster_replica_up{replica="1"} 1' in out.stdout
        out = subprocess.run([sys.executable, "-m", "kvreuse.runtime.cli.main", "cluster", "reset", "--workdir", str(work)],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert out.returncode == 0 and out.stdout.count(": ok") == 2, out.stdout + out.stderr
        text = (tmp_path / "cluster.out").read_text()
        assert "replica 0 failed to restart (1x)" in text and "valkey is back after" in text, text
    finally:
        children = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(90)
        gone, alive = psutil.wait_procs(children, timeout=10)
        for p in alive:
            p.kill()
    assert rc == 0 and not alive


def test_an_idle_replicas_shared_tier_follows_the_store_down_and_back(tmp_path):
    """No request touches the tier: only its background check can see the store go and come back."""
    from kvreuse.runtime.cache.store.shared import SharedStore
    from kvreuse.runtime.cache.store.shared_tier import SharedTier
    from kvreuse.runtime.cluster.services import start_valkey

    svc, url = start_valkey(tmp_path, "64mb", password="pw")
    tier = SharedTier(SharedStore(url, "ab" * 20), retry_s=0.3)
    try:
        time.sleep(0.8)
        assert tier.error is None
        svc.kill()
        end = time.monotonic() + 5
        while tier.error is None and time.monotonic() < end:
            time.sleep(0.05)
        assert tier.error is not None and "Connection" in tier.error
        svc, _ = start_valkey(tmp_path, "64mb", port=int(url.rsplit(":", 1)[1]), password="pw")
        end = time.monotonic() + 5
        while tier.error is not None and time.monotonic() < end:
            time.sleep(0.05)
        assert tier.error is None
    finally:
        tier.close()
        svc.stop()
