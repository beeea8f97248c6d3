"""Continuous batching: aggregate decode tokens/s by number of streams, and decode stalls under chunked prefill.

Run from the repository root: ``python -m kvreuse.benchmarks.serving.batching [--quick] [--out PATH] [--threads N]``.

* streams: N requests (fresh random prompts of ``--stream-prompt`` tokens) decode ``--decode-tokens`` greedy
  tokens together.  The engine is driven step by step; the decode window starts after the step in which
  the last stream got its first token, and aggregate tokens/s = tokens produced in the window / its time.
  Rounds cycle through 1, 2, 4, 8, 16 streams.  Target: 8 streams >= 3x one stream.
* chunked prefill: 4 streams are decoding when a ``--long-prompt``-token prompt arrives.  Every stream's
  token arrival is timestamped after each step; the inter-token latencies (ITL) while the long prompt is
  prefilled (from its submission to its first token) give the p99.  One chunk's time is the long prompt's
  prefill time with no streams running divided by its number of chunks, measured in the same round.
  Target: p99 ITL <= 1.5x one chunk's time, for chunk sizes 256 / 512 / 1024.

One engine (``prefix_cache="off"``, ``kv_cache_memory="1G"``) serves everything; the chunk size is set on
its scheduler between runs so the variants interleave in one process.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from kvreuse.benchmarks.common import (
    base_parser,
    bench_main,
    format_table,
    median,
    percentile,
    progress,
    reps,
    synthetic_prompt,
)

SCALING_TARGET, ITL_TARGET = 3.0, 1.5


class Driver:
    """One engine, fresh prompts, and step-level timing of token arrivals."""

    def __init__(self) -> None:
        from kvreuse.runtime.engine.engine import Engine

        self.engine = Engine(dtype="float32", prefix_cache="off", kv_cache_memory="1G", max_running=64)
        self.seed = 10_000

    def fresh(self, n: int) -> list[int]:
        self.seed += 1
        return synthetic_prompt(n, self.seed)

    def add(self, n_prompt: int, max_tokens: int) -> str:
        from kvreuse.runtime.sampling.params import SamplingParams

        req = self.engine.make_request(
            self.fresh(n_prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        )
        self.engine.submit(req)
        return req.request_id

    def step(self) -> tuple[float, dict[str, int]]:
        """One engine step; returns its end time and, per request that got tokens, how many it got."""
        outs = self.engine.step()
        now = time.perf_counter()
        return now, {o.request_id: len(o.new_token_ids) for o in outs}

    def decode_rate(self, n_streams: int, n_prompt: int, n_tokens: int) -> float:
        ids = {self.add(n_prompt, n_tokens + 1) for _ in range(n_streams)}
        started: set[str] = set()
        while started != ids:  # prefill until every stream has its first token
            _, got = self.step()
            started |= got.keys() & ids
        t0, produced = time.perf_counter(), 0
        while self.engine.has_work():
            _, got = self.step()
            produced += sum(1 for r in got if r in ids)
        return produced / (time.perf_counter() - t0)

    def prefill_alone(self, n_prompt: int) -> list[float]:
        """Seconds of each step (one chunk each) of a lone prompt's prefill."""
        rid, times = self.add(n_prompt, 1), []
        while True:
            t0 = time.perf_counter()
            now, got = self.step()
            times.append(now - t0)
            if rid in got:
                return times

    def itl_under_prefill(self, n_streams: int, n_prompt: int, long_prompt: int, chunk: int) -> list[float]:
        """Inter-token latencies of running streams while a long prompt is prefilled in chunks."""
        budget = math.ceil(long_prompt / chunk) + 8
        streams = [self.add(n_prompt, budget + 16) for _ in range(n_streams)]
        last: dict[str, float] = {}
        while len(last) < n_streams:  # get every stream decoding
            now, got = self.step()
            last.update({r: now for r in got if r in streams})
        self.step()  # one plain decode step so every stream's last arrival is from a decode
        now = time.perf_counter()
        last = dict.fromkeys(streams, now)
        long_id = self.add(long_prompt, 1)
        itl: list[float] = []
        done = False
        while not done:
            now, got = self.step()
            for r in streams:
                if r in got:
                    itl.append(now - last[r])
                    last[r] = now
            done = long_id in got
        for r in streams:
            self.engine.abort(r)
        while self.engine.has_work():
            self.step()
        return itl


def run(args: argparse.Namespace) -> dict:
    drv = Driver()
    n_reps = reps(args)
    counts = [int(x) for x in args.streams.split(",")]
    chunks = [int(x) for x in args.chunk_sizes.split(",")]
    drv.decode_rate(2, args.stream_prompt, 4)  # warm-up
    rates: dict[int, list[float]] = {n: [] for n in counts}
    for _ in range(n_reps):
        for n in counts:
            rates[n].append(drv.decode_rate(n, args.stream_prompt, args.decode_tokens))
            progress(f"{n} streams: {rates[n][-1]:.2f} tok/s")
    one = median(rates[counts[0]])
    stream_rows = [(n, median(rates[n]), median(rates[n]) / one) for n in counts]
    scaling = {
        "rows": [{"streams": n, "tok_s": r, "vs_one": s, "samples": rates[n]} for n, r, s in stream_rows]
    }
    if 8 in rates:
        scaling["eight_vs_one"] = median(rates[8]) / one
        scaling["met"] = scaling["eight_vs_one"] >= SCALING_TARGET

    itls: dict[int, list[float]] = {c: [] for c in chunks}
    alone: dict[int, list[float]] = {c: [] for c in chunks}
    for _ in range(n_reps):
        for c in chunks:
            drv.engine.scheduler.chunk_size = c  # the prefill budget from the next step on
            # The slowest chunk alone (the last: it attends to the whole prefix) is what a decode can
            # be stalled by; the mean chunk understates late chunks by up to ~2x at 4K tokens.
            alone[c].append(max(drv.prefill_alone(args.long_prompt)))
            itls[c].extend(drv.itl_under_prefill(args.chunk_streams, args.stream_prompt, args.long_prompt, c))
            progress(f"chunk {c}: one chunk {alone[c][-1]:.3f} s, ITL max so far {max(itls[c]):.3f} s")
    drv.engine.cache.check_integrity()
    chunk_rows, chunked = [], []
    for c in chunks:
        one_chunk, p99 = median(alone[c]), percentile(itls[c], 99)
        ratio = p99 / one_chunk
        chunk_rows.append((c, one_chunk, median(itls[c]), p99, max(itls[c]), ratio, ratio <= ITL_TARGET))
        chunked.append({"chunk_size": c, "one_chunk_s": one_chunk, "itl_median_s": median(itls[c]), "itl_p99_s": p99,
                        "itl_max_s": max(itls[c]), "p99_over_chunk": ratio, "met": ratio <= ITL_TARGET,
                        "itl_samples_s": itls[c], "chunk_samples_s": alone[c]})  # fmt: skip
    t1 = format_table(["streams", "aggregate decode tok/s", "x one stream"], stream_rows)
    t2 = format_table(["chunk", "slowest chunk alone s", "ITL median s", "ITL p99 s", "ITL max s", "p99 / chunk", "met"],
                      chunk_rows)  # fmt: skip
    print(t1, "\n")
    print(t2)
    return {"decode_scaling": scaling, "chunked_prefill": chunked, "tables": {"streams": t1, "chunked": t2},
            "targets": {"eight_vs_one": SCALING_TARGET, "p99_over_chunk": ITL_TARGET}}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("batching", __doc__.splitlines()[0])
    p.add_argument("--streams", default="1,2,4,8,16", help="concurrent stream counts")
    p.add_argument("--stream-prompt", type=int, default=128, help="prompt tokens of each stream")
    p.add_argument("--decode-tokens", type=int, default=32, help="tokens each stream decodes in the window")
    p.add_argument("--chunk-sizes", default="256,512,1024")
    p.add_argument("--chunk-streams", type=int, default=4, help="streams decoding during the long prefill")
    p.add_argument("--long-prompt", type=int, default=4000)
    args = p.parse_args(argv)
    if args.quick:
        args.streams, args.stream_prompt, args.decode_tokens = "1,2,8", 32, 4
        args.chunk_sizes, args.long_prompt = "128,256", 512
    return args


def main(argv: list[str] | None = None) -> int:
    return bench_main("batching", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
