"""Schema fuzzing of a real ``kvreuse serve`` with schemathesis (every check), counting responses.

``python -m tests.fuzz_server [--max-examples N] [--out benchmarks/results/fuzz.json]`` starts a
server with a 64-token context (so every accepted generation is short), runs ``schemathesis run
--checks all`` against its ``/openapi.json``, and counts each response status from schemathesis'
NDJSON events: the acceptance is 0 responses >= 500, 0 requests without a response (hangs or
dropped connections), and a server that still answers ``/health`` and a generation at the end.
The other checks' findings (e.g. a schema-valid request refused for a reason the schema cannot
say, such as a prompt longer than the context) are listed, not hidden.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from kvreuse.runtime.server.launcher import ServerProcess

SERVER_ARGS = [
    "--max-model-len",
    "64",
    "--max-running",
    "4",
    "--max-waiting",
    "4",
    "--kv-cache-memory",
    "64M",
]


def schemathesis_bin() -> str:
    here = Path(sys.executable).with_name("schemathesis")
    return str(here) if here.exists() else shutil.which("schemathesis") or "schemathesis"


def _body_head(body: object) -> str:
    if isinstance(body, dict) and "$base64" in body:
        return base64.b64decode(body["$base64"]).decode("utf-8", "replace")[:300]
    return str(body)[:300]


def count_events(ndjson: Path) -> dict:
    """Status counts over every request schemathesis sent, and the failing checks by name."""
    statuses: Counter = Counter()
    failed_checks: Counter = Counter()
    no_response = 0
    unanswered: list[str] = []
    for line in ndjson.read_text().splitlines():
        event = json.loads(line)
        rec = event.get("ScenarioFinished", {}).get("recorder")
        if not rec:
            continue
        for inter in rec.get("interactions", {}).values():
            resp = inter.get("response")
            if resp is None:
                no_response += 1
                req = inter.get("request", {})
                unanswered.append(f"{req.get('method')} {req.get('uri')} {_body_head(req.get('body'))}")
            else:
                statuses[resp["status_code"]] += 1
        for checks in rec.get("checks", {}).values():
            for c in checks:
                if c["status"] == "failure":
                    failed_checks[c["name"]] += 1
    return {
        "requests": sum(statuses.values()) + no_response,
        "statuses": dict(sorted(statuses.items())),
        "responses_5xx": sum(n for s, n in statuses.items() if s >= 500),
        "no_response": no_response,
        "unanswered": unanswered[:10],
        "failed_checks": dict(failed_checks),
    }


KEY_FILE = "key-tenant-a a\nkey-tenant-b b\nkey-operator @operator\n"  # --keys: tenants + the operator


def fuzz(
    url: str,
    max_examples: int,
    workdir: Path,
    request_timeout: float = 300.0,
    key: str | None = None,
    paths: str | None = None,
) -> dict:
    """``key``: sent as a Bearer token; ``paths``: a regex of the paths to fuzz (all of them when None)."""
    ndjson = workdir / "events.ndjson"
    cmd = [
        schemathesis_bin(), "--no-color", "run", f"{url}/openapi.json", "--checks", "all",
        "-n", str(max_examples), "--request-timeout", str(request_timeout), "--generation-deterministic",
        "--report-ndjson-path", str(ndjson), *(["-H", f"Authorization: Bearer {key}"] if key else []),
    ] + (["--include-path-regex", paths] if paths else [])  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, timeout=1800)
    out = count_events(ndjson)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["schemathesis_exit"] = proc.returncode
    out["summary"] = (
        proc.stdout[proc.stdout.rfind("SUMMARY") :][:3000]
        if "SUMMARY" in proc.stdout
        else proc.stdout[-3000:]
    )
    return out


def alive(url: str, key: str | None = None) -> bool:
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    h = httpx.get(f"{url}/health", timeout=30)
    body = {"prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}
    g = httpx.post(f"{url}/v1/completions", json=body, timeout=120, headers=auth)
    kv = httpx.get(f"{url}/debug/kv", timeout=30, headers=auth).json()
    return h.status_code == 200 and g.status_code == 200 and kv["ok"] and kv["pages"]["request_pages"] == 0


def run(
    max_examples: int, log_dir: Path, keys: bool = False, paths: str | None = None, model: Path | None = None
) -> dict:
    """``keys``: API keys on (tenants and an operator); schemathesis sends the operator's, which
    every route accepts, so every route is exercised past authentication. ``model``: served instead
    of the embedded one (the tests pass a tiny random model: the embedded one's decoding was ~80% of
    their time, and the HTTP surface under test does not depend on the weights)."""
    args, key = [*SERVER_ARGS, *(["--model", str(model)] if model else [])], None
    if keys:
        (log_dir / "keys").write_text(KEY_FILE)
        args, key = [*args, "--api-key-file", str(log_dir / "keys")], "key-operator"
    server = ServerProcess(args, log_dir / "fuzz_server.log").start()
    try:
        result = fuzz(server.url, max_examples, log_dir, key=key, paths=paths)
        result["alive_at_end"] = alive(server.url, key)
        result["server_exit_code_running"] = server.proc.poll()
    finally:
        server.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-examples", type=int, default=100, help="schemathesis -n (per operation)")
    p.add_argument("--out", default=None, help="write the JSON result here")
    p.add_argument("--keys", action="store_true", help="API keys on (schemathesis sends the operator key)")
    p.add_argument("--paths", default=None, help="only the paths matching this regex (e.g. ^/v1/responses)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        result = run(args.max_examples, Path(d), args.keys, args.paths)
    result = {
        "server_args": SERVER_ARGS, "keys": args.keys, "max_examples": args.max_examples, "paths": args.paths,
        "dtype": "float32",
        "threads": os.environ.get("OMP_NUM_THREADS", "default"), "load_average": os.getloadavg(), **result,
    }  # fmt: skip
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    ok = result["responses_5xx"] == 0 and result["no_response"] == 0 and result["alive_at_end"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
