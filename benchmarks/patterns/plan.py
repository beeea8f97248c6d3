"""What the pattern benchmark runs: token-exact jobs on the tiny real-vocabulary models, timed jobs on
the embedded model.

Token-exact jobs (no timing; counts do not depend on weights) replay every pattern under the Qwen3 stock,
Qwen3 append-only and Llama 3.1 stacks with cached replies, plus the status pair with replayed replies
(the first edition's mode) for comparison.  Timed jobs run a few patterns on the embedded model in
interleaved rounds for TTFT medians and spreads.

Budget (idle 2-core machine): the default fits ~10-15 minutes; the agent-scale session (65 requests up to
~50K tokens; full-recompute patterns prefill ~2M tokens each) is behind ``--full``.
"""

from __future__ import annotations

from typing import NamedTuple

REAL_STACKS = ("qwen3-stock", "qwen3-append", "llama3.1")


class Job(NamedTuple):
    workload: str
    variant: str
    stack: str
    pattern: str
    replies: str  # "cached" | "replayed"


CODING = [
    "append_only", "naive", "timestamp_start", "timestamp_end", "timestamp_end_tools_first", "user_profile",
    "tools_reordered", "tools_dynamic_after", "tools_dynamic_sorted_in", "tools_toggled", "tools_toggle_message",
    "sliding_window", "sliding_window_block", "text_stable", "text_unstable", "status_replace", "status_append",
    "status_in_system", "skill_in_system", "skill_in_messages", "date_in_system", "date_in_messages",
    "reasoning_stripped",
]  # fmt: skip
RESEARCH = ["append_only", "compress_budget", "compress_unfrozen", "compress_every_turn", "compress_summary",
            "compact_threshold"]  # fmt: skip
FANOUT = ["append_only", "subagent_own_system"]
AGENT = ["append_only", "timestamp_end", "tools_reordered", "sliding_window", "compact_threshold"]
TIMED = ["append_only", "naive", "timestamp_start", "timestamp_end", "tools_reordered", "sliding_window",
         "status_append"]  # fmt: skip


def _applies(stack: str, workload: str, pattern: str) -> bool:
    if stack == "llama3.1" and (workload == "fanout" or pattern == "timestamp_end_tools_first"):
        return False  # Llama 3.1 takes one tool call per message; it has no system-then-tools block
    return True


def token_jobs(full: bool, quick: bool, stacks: tuple[str, ...] = REAL_STACKS) -> list[Job]:
    """The token-exact jobs for ``stacks`` (``smollm2``: the target model's own tokenizer, e.g. a
    ``--model`` hybrid)."""
    if quick:
        return [Job("coding", "default", s, p, "cached") for s in stacks
                for p in ("append_only", "timestamp_start", "tools_reordered", "sliding_window", "status_replace",
                          "status_append")]  # fmt: skip
    groups = [("coding", CODING), ("research", RESEARCH), ("fanout", FANOUT)]
    if full:
        groups.append(("agent", AGENT))
    jobs = [
        Job(w, "default", s, p, "cached") for w, ps in groups for s in stacks for p in ps if _applies(s, w, p)
    ]
    if "qwen3-append" in stacks:
        jobs += [Job("coding", "default", "qwen3-append", p, "replayed") for p in ("append_only", "status_replace",
                                                                                  "status_append")]  # fmt: skip
    return jobs


def timed_jobs(quick: bool) -> list[Job]:
    names = TIMED[:4] if quick else TIMED
    return [Job("coding", "quick", "smollm2", p, "replayed") for p in names]
