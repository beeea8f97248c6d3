"""TTFT per turn of a 10-turn agent conversation, prefix cache on vs off, against the suffix-prefill limit.

Run from the repository root: ``python -m kvreuse.benchmarks.serving.ttft_multiturn [--quick] [--out PATH] [--threads N]``.

The conversation is seeded text in the model's chat template (a system prompt, then user/assistant turns of
``--min-new``..``--max-new`` new tokens each), rendered to token ids for every turn; each turn's prompt
extends the previous one.  Each request generates one token (TTFT is what is measured).  Per turn, in one
process and alternating: the ``off`` engine (recomputes the whole prompt), the ``radix`` engine (prefills
only what earlier turns did not compute), then the *limit*: the model forward of exactly the radix run's
suffix at that depth, on top of K/V of the cached prefix, by a model runner of its own, repeated warm (no scheduling,
tree or request bookkeeping), median of ``--limit-reps``.  Each repetition replays the whole conversation on a reset tree.
Targets at the last turn: off / radix >= 5x, radix / limit <= 1.3x.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from kvreuse.benchmarks.common import (
    base_parser,
    bench_main,
    format_table,
    median,
    progress,
    reps,
)
from kvreuse.chat_templates.render import first_divergence

SPEEDUP_TARGET, LIMIT_TARGET = 5.0, 1.3
WORDS = (
    "the a function returns value file test error module request cache page token prefix tree engine "
    "scheduler batch decode prefill memory pool step we should check read write update config list dict "
    "path line import class method call result output input server client agent tool schema json field "
    "and or but because so then when if not with from into over under after before each every all some "
    "fix bug slow fast large small first last next previous new old run build commit branch merge review"
).split()


def _text(rng: random.Random, tokenizer, n_tokens: int) -> str:
    """Seeded prose of about ``n_tokens`` tokens (sentences of common engineering words)."""
    words: list[str] = []
    while len(tokenizer.encode(" ".join(words), add_special_tokens=False)) < n_tokens:
        sentence = [rng.choice(WORDS) for _ in range(rng.randint(6, 14))]
        sentence[0] = sentence[0].capitalize()
        words.extend(sentence[:-1] + [sentence[-1] + rng.choice([".", ".", "?", ":", ";"])])
    return " ".join(words)


def conversation_prompts(
    tokenizer, turns: int, seed: int = 0, system_tokens: int = 250, min_new: int = 150, max_new: int = 250
) -> list[list[int]]:
    """Token ids of each turn's prompt (chat template, generation prompt added); each extends the last."""
    rng = random.Random(seed)
    messages = [{"role": "system", "content": _text(rng, tokenizer, system_tokens)}]
    prompts: list[list[int]] = []
    for t in range(turns):
        new = rng.randint(min_new, max_new)
        if t > 0:  # the previous turn's answer, then this turn's question
            messages.append({"role": "assistant", "content": _text(rng, tokenizer, int(new * 0.6))})
        messages.append({"role": "user", "content": _text(rng, tokenizer, new if t == 0 else int(new * 0.4))})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
    return prompts


class SuffixLimit:
    """The limit: our model runner alone computing a suffix over K/V already in its pool.

    A private runner (same weights, its own pool) keeps the K/V of the last prompt it saw at their
    positions; a later prompt sharing a prefix with it only computes what is missing before the timed
    forward of ``prompt[cached:]``, which rewrites the same values.  No engine internals are touched.
    """

    def __init__(self, engine, max_tokens: int) -> None:
        from kvreuse.runtime.runner.model_runner import ModelRunner

        self.page_size = engine.cache.page_size
        n_pages = -(-max_tokens // self.page_size)
        dtype = str(engine.dtype).removeprefix("torch.")
        self.runner = ModelRunner(engine.model_dir, dtype, str(engine.device), self.page_size, None, n_pages)
        self.pages = list(range(n_pages))
        self.tokens: list[int] = []  # whose K/V the pool holds, at their positions

    def _forward(self, tokens: list[int], start: int) -> None:
        from kvreuse.runtime.runner.forward_batch import SeqChunk, StepInput
        from kvreuse.runtime.runner.model_state import StateInput
        from kvreuse.runtime.sampling.params import SamplingParams

        pages = self.pages[: -(-(start + len(tokens)) // self.page_size)]
        # a hybrid's linear layers run from slot 0's state: the same work as from the real snapshot (a
        # model without state ignores it)
        states = StateInput([0], [start == 0], [[]], [], [None])
        self.runner.step(
            StepInput([SeqChunk(tokens, start, pages)], [True], [SamplingParams()], [None], states)
        )

    def median_s(self, prompt: list[int], cached: int, n_reps: int) -> float:
        """Median seconds of the forward (+ sampling) of ``prompt[cached:]`` over K/V of ``prompt[:cached]``."""
        valid = first_divergence(self.tokens, prompt)
        if valid < cached:
            self._forward(prompt[valid:cached], valid)
        self.tokens = list(prompt)
        times = []
        for i in range(n_reps + 1):  # first one warms up
            t0 = time.perf_counter()
            self._forward(prompt[cached:], cached)
            if i:
                times.append(time.perf_counter() - t0)
        return median(times)


def run(args: argparse.Namespace) -> dict:
    from kvreuse.runtime.engine.engine import Engine
    from kvreuse.runtime.sampling.params import SamplingParams

    opts = dict(dtype="float32", kv_cache_memory="512M", page_size=args.page_size, chunk_size=args.chunk_size)
    opts["model"] = args.model  # None: the embedded SmolLM2; a hybrid (Qwen3.5) reuses through snapshots
    engines = {"off": Engine(prefix_cache="off", **opts), "radix": Engine(prefix_cache="radix", **opts)}
    prompts = conversation_prompts(engines["radix"].tokenizer, args.turns, args.seed, args.system_tokens,
                                   args.min_new, args.max_new)  # fmt: skip
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    limit = SuffixLimit(engines["radix"], max(len(p) for p in prompts))
    n_reps = reps(args)
    per_turn = [{"off": [], "radix": [], "limit": [], "cached": [], "prefilled": []} for _ in prompts]
    for r in range(n_reps + 1):  # round 0 (first turn only) warms both engines up and is not recorded
        engines["radix"].reset_prefix_cache()
        for t, prompt in enumerate(prompts if r else prompts[:1]):
            off = engines["off"].generate([prompt], params)[0]
            rad = engines["radix"].generate([prompt], params)[0]
            assert off.output_token_ids == rad.output_token_ids, f"turn {t}: cache changed the greedy token"
            lim = limit.median_s(prompt, rad.cached_tokens, args.limit_reps)
            progress(
                f"round {r} turn {t + 1}: off {off.ttft_s:.3f} s, radix {rad.ttft_s:.3f} s, limit {lim:.3f} s"
            )
            if r == 0:
                continue
            d = per_turn[t]
            d["off"].append(off.ttft_s)
            d["radix"].append(rad.ttft_s)
            d["limit"].append(lim)
            d["cached"].append(rad.cached_tokens)
            d["prefilled"].append(rad.prefilled_tokens)
        engines["radix"].cache.check_integrity()
    rows, turns = [], []
    prev: list[int] = []
    for t, (prompt, d) in enumerate(zip(prompts, per_turn)):
        off, rad, lim = median(d["off"]), median(d["radix"]), median(d["limit"])
        new = len(prompt) - first_divergence(prev, prompt)
        prev = prompt
        turns.append({
            "turn": t + 1, "prompt_tokens": len(prompt), "new_tokens": new, "cached_tokens": d["cached"][0],
            "prefilled_tokens": d["prefilled"][0], "ttft_off_s": off, "ttft_radix_s": rad, "limit_s": lim,
            "speedup": off / rad, "radix_over_limit": rad / lim, "times_s": d,
        })  # fmt: skip
        rows.append(
            (t + 1, len(prompt), new, d["cached"][0], d["prefilled"][0], off, rad, lim, off / rad, rad / lim)
        )
    last = turns[-1]
    met = {"speedup": last["speedup"] >= SPEEDUP_TARGET, "limit": last["radix_over_limit"] <= LIMIT_TARGET}
    table = format_table(
        ["turn", "prompt", "new", "cached", "prefilled", "TTFT off s", "TTFT radix s", "limit s", "off/radix",
         "radix/limit"], rows,
    )  # fmt: skip
    summary = (
        f"last turn: off/radix = {last['speedup']:.2f}x (target >= {SPEEDUP_TARGET}x: {'met' if met['speedup'] else 'NOT met'}), "
        f"radix/limit = {last['radix_over_limit']:.2f}x (target <= {LIMIT_TARGET}x: {'met' if met['limit'] else 'NOT met'})"
    )
    print(table)
    print(summary)
    snaps = engines["radix"].stats()
    return {"turns": turns, "table": table, "summary": summary, "targets_met": met, "model": args.model,
            "dtype": str(engines["radix"].dtype).removeprefix("torch."),
            "snapshots": {"count": snaps.snapshots, "bytes": snaps.snapshot_bytes, "cut_tokens": snaps.snapshot_cut_tokens},
            "targets": {"speedup": SPEEDUP_TARGET, "radix_over_limit": LIMIT_TARGET}}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser("ttft_multiturn", __doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model (default: embedded SmolLM2-135M)")
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--system-tokens", type=int, default=250)
    p.add_argument("--min-new", type=int, default=150, help="fewest new tokens a turn")
    p.add_argument("--max-new", type=int, default=250, help="most new tokens a turn")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument("--limit-reps", type=int, default=3, help="warm repetitions of the limit forward per turn")
    args = p.parse_args(argv)
    if args.quick:
        args.turns, args.system_tokens, args.min_new, args.max_new, args.limit_reps = 3, 60, 40, 60, 1
    return args


def main(argv: list[str] | None = None) -> int:
    return bench_main("ttft_multiturn", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
