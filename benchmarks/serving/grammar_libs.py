"""Which grammar library constrains decoding: xgrammar vs llguidance vs outlines-core on this CPU.

For the embedded SmolLM2 vocabulary (49,152 tokens) and a few JSON schemas, each library compiles the
schema (time reported) and then walks a seeded random path of allowed tokens; every step computes the
next-token mask (the per-token cost a constrained request adds to the step) and consumes one token.
The libraries that are not installed are skipped (only the chosen one is a dependency).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import time
from typing import Any

import torch

from kvreuse.benchmarks.common import base_parser, bench_main, format_table, median, model_dir, progress

SCHEMAS: dict[str, dict[str, Any]] = {
    "weather_args": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
    },
    "order": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                    "required": ["sku", "qty"],
                },
            },
            "paid": {"type": "boolean"},
            "note": {"type": ["string", "null"]},
        },
        "required": ["id", "items", "paid"],
    },
}


def _walk(fill, consume, allowed_of, steps: int, seed: int) -> list[float]:
    """Seeded random walk over allowed tokens; returns the seconds of each mask computation."""
    rng = random.Random(seed)
    times: list[float] = []
    for _ in range(steps):
        t0 = time.perf_counter()
        state = fill()
        times.append(time.perf_counter() - t0)
        allowed = allowed_of(state)
        if not allowed:
            break
        if not consume(rng.choice(allowed)):
            break
    return times


def _bits_allowed(bitmask: torch.Tensor, vocab: int) -> list[int]:
    bits = ((bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:vocab]
    return bits.nonzero().flatten().tolist()


def bench_xgrammar(tok: Any, vocab: int, schema: dict, steps: int, seed: int) -> dict[str, Any]:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(schema, any_whitespace=False)
    compile_s = time.perf_counter() - t0
    m = xgr.GrammarMatcher(compiled)
    bm = xgr.allocate_token_bitmask(1, vocab)

    def fill() -> torch.Tensor:
        m.fill_next_token_bitmask(bm)
        return bm

    times = _walk(fill, m.accept_token, lambda b: _bits_allowed(b, vocab), steps, seed)
    return {"compile_s": compile_s, "mask_s": times}


def bench_llguidance(tok: Any, vocab: int, schema: dict, steps: int, seed: int) -> dict[str, Any]:
    import llguidance as llg
    import llguidance.hf
    import llguidance.torch as llt

    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
    t0 = time.perf_counter()
    grammar = llg.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
    m = llg.LLMatcher(lltok, grammar)
    compile_s = time.perf_counter() - t0
    bm = llt.allocate_token_bitmask(1, vocab)

    def fill() -> torch.Tensor:
        llt.fill_next_token_bitmask(m, bm, 0)
        return bm

    times = _walk(fill, m.consume_token, lambda b: _bits_allowed(b, vocab), steps, seed)
    return {"compile_s": compile_s, "mask_s": times}


def bench_outlines(tok: Any, vocab: int, schema: dict, steps: int, seed: int) -> dict[str, Any]:
    import json

    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    byte_dec = _byte_decoder()
    eos = tok.eos_token_id
    mapping: dict[bytes, list[int]] = {}
    for t, i in tok.get_vocab().items():
        if i == eos or i >= vocab or t in tok.all_special_tokens:
            continue
        try:
            b = bytes(byte_dec[c] for c in t)
        except KeyError:
            b = t.encode()
        mapping.setdefault(b, []).append(i)
    voc = Vocabulary(eos, mapping)
    t0 = time.perf_counter()
    index = Index(build_regex_from_schema(json.dumps(schema)), voc)
    compile_s = time.perf_counter() - t0
    guide = Guide(index)
    state = {"allowed": guide.get_tokens()}

    def fill() -> list[int]:
        state["allowed"] = guide.get_tokens()
        return state["allowed"]

    def consume(t: int) -> bool:
        guide.advance(t)
        return not guide.is_finished()

    times = _walk(fill, consume, lambda a: [t for t in a if t != eos] or list(a), steps, seed)
    return {"compile_s": compile_s, "mask_s": times}


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, reversed (token strings -> raw bytes)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


LIBS = {"xgrammar": bench_xgrammar, "llguidance": bench_llguidance, "outlines_core": bench_outlines}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from kvreuse.runtime.loading.tokenizer import load_tokenizer
    from kvreuse.runtime.models.config import ModelConfig

    d = model_dir()
    tok = load_tokenizer(d)
    vocab = ModelConfig.from_dir(d).vocab_size
    steps = 16 if args.quick else args.steps
    rows, results = [], {}
    for lib, fn in LIBS.items():
        if importlib.util.find_spec(lib) is None:
            progress(f"{lib}: not installed, skipped")
            continue
        for name, schema in SCHEMAS.items():
            progress(f"{lib} {name}")
            r = fn(tok, vocab, schema, steps, seed=0)
            mask_us = median(r["mask_s"]) * 1e6
            results[f"{lib}/{name}"] = {
                "compile_ms": r["compile_s"] * 1e3,
                "mask_us_median": mask_us,
                "mask_us_max": max(r["mask_s"]) * 1e6,
                "steps": len(r["mask_s"]),
            }
            rows.append([lib, name, r["compile_s"] * 1e3, mask_us, max(r["mask_s"]) * 1e6])
    print(format_table(["library", "schema", "compile ms", "mask us (median)", "mask us (max)"], rows))
    return {"vocab_size": vocab, "dtype": "n/a (CPU masks)", "results": results}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("grammar_libs", __doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=64, help="tokens walked per schema")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return bench_main("grammar_libs", parse_args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
