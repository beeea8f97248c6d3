"""Tenant isolation: TTFT of tenant B sending tenant A's exact prompt vs a cold prompt.

Run from the repository root: ``python -m kvreuse.benchmarks.serving.tenant_isolation [--quick] [--out PATH]``.

A cached prefix is observably faster (CVE-2025-46570); with tenants salting the cache, B's request
for A's prompt must look like a cold prompt.  Per round, in one process and interleaved: A runs a
fresh prompt P, B runs P (``b_after_a``), C runs another fresh prompt (``cold``), A runs P again
(``a_warm``, the timing a shared cache would leak).  Goal: B's median TTFT / cold median ~ 1 (the
distributions overlap) while A's warm run is much faster.  (The per-tenant flood is a load test:
``tests/test_server_tenants.py``; benchmarks may not import the server.)  The model is a random 4-layer Llama (hidden 256), fp32 on CPU, so the prefill cost
is real but small; the machine is shared, so the load average is recorded.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

from kvreuse.benchmarks.common import base_parser, bench_main, median, percentile, progress
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.request import CacheScope
from kvreuse.runtime.sampling.params import SamplingParams

VOCAB, PROMPT = 49152, 400


def _ttft(eng: Engine, prompt: list[int], scope: CacheScope) -> tuple[float, int]:
    req = eng.make_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    req.scope = scope
    eng.submit(req)
    while eng.has_work():
        eng.step()
    return req.first_token_time - req.arrival, req.cached_tokens


def timings(eng: Engine, rounds: int) -> dict:
    rng = random.Random(0)
    fresh = lambda: [rng.randrange(3, VOCAB) for _ in range(PROMPT)]  # noqa: E731
    out: dict[str, list[float]] = {"b_after_a": [], "cold": [], "a_warm": []}
    cached = {k: [] for k in out}
    for r in range(-1, rounds):  # round -1 warms up
        p = fresh()
        _ttft(eng, p, CacheScope("A"))
        for name, prompt, tenant in (("b_after_a", p, "B"), ("cold", fresh(), "C"), ("a_warm", p, "A")):
            t, c = _ttft(eng, prompt, CacheScope(tenant))
            if r >= 0:
                out[name].append(t)
                cached[name].append(c)
    summary = {k: {"median_ms": 1000 * median(v), "p10_ms": 1000 * percentile(v, 10),
                   "p90_ms": 1000 * percentile(v, 90), "all_ms": [round(1000 * x, 2) for x in v],
                   "cached_tokens": sorted(set(cached[k]))} for k, v in out.items()}  # fmt: skip
    cold = median(out["cold"])
    summary["b_over_cold"] = median(out["b_after_a"]) / cold
    summary["a_warm_over_cold"] = median(out["a_warm"]) / cold
    return summary


def run(args: argparse.Namespace) -> dict:
    from tests.helpers import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "m", vocab=VOCAB, hidden_size=256, intermediate_size=512,
                                num_hidden_layers=4, max_position_embeddings=2048)  # fmt: skip
        eng = Engine(model_dir=str(model), dtype="float32", device="cpu", num_pages=1024)
        t = timings(eng, 4 if args.quick else 12)
        progress(f"B/cold {t['b_over_cold']:.3f}, A warm/cold {t['a_warm_over_cold']:.3f}")
    return {"dtype": "float32", "prompt_tokens": PROMPT, "ttft": t}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return base_parser("tenant_isolation", __doc__.split("\n")[0]).parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return bench_main("tenant_isolation", parse_args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
