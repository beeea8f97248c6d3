"""Decode cost of constrained streams: 8 streams where 4 follow a JSON schema vs 8 free, side by side.

Each round admits 8 streams (same prompts), prefills them, then times ``--steps`` decode steps of the
whole batch; the constrained variant's 4 schema streams pay for mask computation (llguidance) and
mask application in the batched sampler.  Also reports grammar compile time per schema (first
compile, then the cached lookup) and a new request's first mask on a 3,000-property schema.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from kvreuse.benchmarks.common import (
    base_parser,
    bench_main,
    format_table,
    interleave,
    median,
    progress,
    reps,
)
from kvreuse.runtime.engine.engine import Engine
from kvreuse.runtime.sampling import sampler
from kvreuse.runtime.sampling.constrained import json_schema, tool_call
from kvreuse.runtime.sampling.constrained.matcher import Matcher
from kvreuse.runtime.sampling.params import SamplingParams

STORY = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "text": {"type": "string"}},
    "required": ["title", "text"],
}
COMPILE_SCHEMAS = {
    "story": STORY,
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
            "pets": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        },
        "required": ["name", "age"],
    },
    "order": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "items": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}}, "required": ["sku", "qty"]}},
            "status": {"type": "string", "enum": ["new", "paid", "shipped"]}, "note": {"type": ["string", "null"]},
        },
        "required": ["id", "items", "status"],
    },
}  # fmt: skip
TOOLS = [(n, s) for n, s in COMPILE_SCHEMAS.items()]


class _MaskClock:
    """Wraps the sampler's ``apply_constraints`` to add up the time it takes: on a loaded machine the
    round-to-round noise dwarfs the mask cost, so the cost is also reported as a share of step time."""

    def __init__(self) -> None:
        self.fn, self.total, self.shares = sampler.apply_constraints, 0.0, []
        sampler.apply_constraints = self

    def __call__(self, *a):
        t0 = time.perf_counter()
        try:
            return self.fn(*a)
        finally:
            self.total += time.perf_counter() - t0


def _round(eng: Engine, prompts: list[str], constrained: int, steps: int, clock: _MaskClock) -> float:
    g = json_schema(STORY)
    params = [
        SamplingParams(
            max_tokens=steps + 64, temperature=0.0, ignore_eos=True, grammar=g if i < constrained else None
        )
        for i in range(len(prompts))
    ]
    reqs = [eng.make_request(p, sp) for p, sp in zip(prompts, params)]
    for r in reqs:
        eng.submit(r)
    while any(len(r.output_ids) == 0 for r in reqs):  # admit + prefill (not timed)
        eng.step()
    clock.total = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        eng.step()
    dt = time.perf_counter() - t0
    if constrained:
        clock.shares.append(clock.total / dt)
    for r in reqs:
        eng.abort(r.request_id)
    eng.step()
    eng.reset_prefix_cache()
    return dt


def _first_mask_ms(eng: Engine, properties: int = 3000) -> dict[str, float]:
    """A new request's first mask on the engine step, for a schema of ``properties`` optional strings
    (the fairness benchmark's attack): the copy of a compiled matcher whose first mask was built at
    compile (what ``GrammarCompiler`` hands out) vs the copy of one that never computed a mask."""
    import llguidance
    import torch

    g = eng.admission.grammars
    row = torch.empty((g.vocab_size + 31) // 32, dtype=torch.int32)
    out = {}
    for warmed in (True, False):
        schema = {
            "type": "object",
            "properties": {f"p{warmed:d}{i}": {"type": "string"} for i in range(properties)},
        }
        grammar = json_schema(schema)
        if warmed:
            m = g.matcher(grammar, 64)
        else:  # compiled as GrammarCompiler does, without its first mask
            bare = llguidance.LLMatcher(g._llg_tokenizer(), grammar.source, log_level=0)
            m = Matcher(bare.deep_copy(), g.eos_ids)
        t0 = time.perf_counter()
        m.fill(row)
        out["built at compile" if warmed else "not built at compile"] = (time.perf_counter() - t0) * 1e3
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    eng = Engine(kv_cache_memory=256 << 20)
    steps = 8 if args.quick else args.steps
    tok = eng.tokenizer
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"Write story {i} as JSON with a title and text."}],
            tokenize=False,
            add_generation_prompt=True,
        )  # fmt: skip
        for i in range(args.streams)
    ]
    compile_ms = {}
    for name, schema in COMPILE_SCHEMAS.items():
        g = json_schema(schema)
        eng.admission.grammars.compiled(g)  # the first compile also builds the llguidance tokenizer once
        compile_ms[name] = eng.admission.grammars.compile_s["json_schema"] * 1e3
        t0 = time.perf_counter()
        eng.admission.grammars.compiled(g)
        compile_ms[name + " (cached)"] = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    eng.admission.grammars.compiled(tool_call(TOOLS, "hermes", None))
    compile_ms["tool_call over 3 tools"] = (time.perf_counter() - t0) * 1e3
    progress(f"compile ms: {compile_ms}")
    first_mask = _first_mask_ms(eng)
    progress(f"a new request's first mask, 3,000-property schema, ms: {first_mask}")
    half = args.streams // 2
    clock = _MaskClock()
    _round(eng, prompts, half, 2, clock)  # warm-up: matcher closers table, kernels
    clock.shares.clear()
    times = interleave(
        {
            "free": lambda r: _round(eng, prompts, 0, steps, clock),
            "constrained": lambda r: _round(eng, prompts, half, steps, clock),
        },
        reps(args),
    )
    share = median(clock.shares)
    free, cons = median(times["free"]), median(times["constrained"])
    n_tok = steps * args.streams
    rows = [["8 free", n_tok / free, 1.0], [f"{half} free + {half} JSON schema", n_tok / cons, cons / free]]
    print(format_table(["streams", "decode tok/s", "step time vs free"], rows))
    print(format_table(["schema", "compile ms"], list(compile_ms.items())))
    print(
        f"mask + bias time / step time in the constrained rounds: {share:.3%} (cost ratio {1 / (1 - share):.3f}x)"
    )
    return {
        "dtype": str(eng.dtype).replace("torch.", ""),
        "streams": args.streams,
        "constrained_streams": half,
        "decode_steps": steps,
        "free_tok_s": n_tok / free,
        "constrained_tok_s": n_tok / cons,
        "cost_ratio": cons / free,
        "mask_share_of_step_time": share,
        "cost_ratio_from_mask_share": 1 / (1 - share),
        "mask_share_samples": clock.shares,
        "target_cost_ratio": 1.3,
        "samples_s": times,
        "grammar_compile_ms": compile_ms,
        "first_mask_ms_3000_properties": first_mask,
        "grammar_library": "llguidance",
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("constrained_decode", __doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per round")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return bench_main("constrained_decode", parse_args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
