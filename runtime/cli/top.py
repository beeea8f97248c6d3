"""``kvreuse top``: a live terminal view of a running server (its ``/metrics`` and ``/v1/cache``).

Polls every ``--interval`` seconds; ``--once`` prints one view and exits (scripts, tests).  An
unreachable server, a refused key or a page that is not kvreuse's is one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import httpx
from rich.console import Console
from rich.live import Live

from kvreuse.runtime.cli.top_view import Sample, render


class TopError(Exception):
    """A one-line reason the server could not be shown."""


def fetch(client: httpx.Client, url: str) -> Sample:
    try:
        metrics = client.get(f"{url}/metrics")
        cache = client.get(f"{url}/v1/cache")
    except (httpx.HTTPError, httpx.InvalidURL) as e:
        raise TopError(f"cannot reach {url}: {e or type(e).__name__}") from None
    for r in (metrics, cache):
        if r.status_code == 401:
            raise TopError(f"{url} needs an API key (--api-key or KVREUSE_API_KEY)")
        if r.status_code == 403:  # with keys on, /metrics shows every tenant: the operator's alone
            raise TopError(f"{r.request.url} needs the server's operator key (--operator-key) as --api-key")
        if r.status_code != 200:
            raise TopError(f"{r.request.url} answered HTTP {r.status_code}")
    if "kvreuse_kv_pages_total" not in metrics.text:
        raise TopError(f"{url}/metrics has no kvreuse metrics: is this a kvreuse server?")
    try:
        return Sample.parse(time.time(), metrics.text, cache.json())
    except ValueError as e:
        raise TopError(f"{url} answered something that is not kvreuse's: {e}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvreuse top", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--url", default="http://127.0.0.1:8000", help="the server (default http://127.0.0.1:8000)"
    )
    p.add_argument("--api-key", default=os.environ.get("KVREUSE_API_KEY"),
                   help="the key, when the server has keys (default: $KVREUSE_API_KEY)")  # fmt: skip
    p.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
    p.add_argument("--once", action="store_true", help="print one view and exit")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.interval <= 0:
        raise ValueError("--interval must be > 0")
    url = args.url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    console = Console()
    try:
        with httpx.Client(headers=headers, timeout=max(30.0, args.interval)) as client:
            sample = fetch(client, url)
            if args.once:
                console.print(render(url, sample, None))
                return 0
            with Live(render(url, sample, None), console=console, screen=False, auto_refresh=False) as live:
                while True:
                    time.sleep(args.interval)
                    before, sample = sample, fetch(client, url)
                    live.update(render(url, sample, before), refresh=True)
    except TopError as e:
        print(f"kvreuse top: error: {e}", file=sys.stderr)
        return 2
