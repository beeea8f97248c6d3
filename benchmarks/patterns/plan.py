"""What the pattern benchmark runs: token-exact jobs on the tiny real-vocabulary models, timed jobs on
the embedded model.

Token-exact jobs (no timing; counts do not depend on weights) replay every pattern under the Qwen3 stock,
Qwen3 append-only and Llama 3.1 stacks with cached replies, plus the status pair with replayed replies
(the first edition's mode) for comparison.  Timed jobs run a few patterns on the embedded model in
interleaved rounds for TTFT medians and spreads.

Budget (idle 2-core machine): the default fits ~10-15 minutes.  The agent-scale session (65 requests up to
~50K tokens; full-recompute patterns prefill ~2M tokens each) runs by default through the engine's reuse
rule (``AccountingTarget``, checked against the engine on every request of ``--full``'s engine runs) with
cache-off twins on both tokenizers; ``--full`` runs it through the engine instead.
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
    prefix_cache: str = "radix"  # "off": the cache-off contrast of a verdict pair (same requests)
    page: int = 0  # page size (0: the run's --page-size); Experiment 2-3 also runs at a provider's 256
    reply_kv: str = "extend"  # cached replies: one extend step, or forced decoding (targets.InProcessTarget)


MAIN_STACK = "qwen3-append"


CODING = [
    "append_only", "naive", "timestamp_start", "timestamp_end", "timestamp_end_tools_first", "user_profile",
    "tools_reordered", "tools_dynamic_after", "tools_dynamic_sorted_in", "tools_toggled", "tools_toggle_message",
    "sliding_window", "sliding_window_block", "text_stable", "text_unstable", "status_replace", "status_append",
    "status_in_system", "skill_in_system", "skill_in_messages", "date_in_system", "date_in_messages",
    "reasoning_stripped", "timestamp_message", "timestamp_tool", "world_state_diff", "world_state_rerender",
    "catalogue_in_prefix", "catalogue_diff", "skill_switch_system", "skill_switch_messages", "skill_reread",
    "tools_deferred", "tools_deferred_schema", "session_env_in_system", "session_env_message",
]  # fmt: skip
RESEARCH = ["append_only", "compress_budget", "compress_unfrozen", "compress_every_turn", "compress_summary",
            "compact_threshold", "compress_l1_budget", "compress_l2_noise", "compress_l3_micro",
            "compress_l4_archive", "compress_l5_full", "compress_layered"]  # fmt: skip
FANOUT = ["append_only", "subagent_own_system", "explore_inline"]
# Experiment 2-3 of [003]: its six modes on a 5-request session, at our page size and at 256-token blocks
EXP23 = [
    "append_only",
    "timestamp_start",
    "tools_reordered",
    "user_profile",
    "sliding_window_5",
    "text_stable",
]
# agent scale: every pattern of a pair row (and the compression ones), under two tokenizers
AGENT = ["append_only", "timestamp_start", "timestamp_end", "timestamp_message", "tools_reordered", "user_profile",
         "sliding_window", "status_replace", "status_append", "compact_threshold", "compress_layered",
         "subagent_own_system",
         # issue 57: the other pair rows' patterns (the same builders: events fall at a third and two thirds of
         # the main thread, as on the coding session)
         "timestamp_tool", "timestamp_end_tools_first", "tools_dynamic_after", "tools_dynamic_sorted_in",
         "tools_toggled", "tools_toggle_message", "sliding_window_block", "text_stable", "text_unstable",
         "status_in_system", "compress_budget", "compress_every_turn", "compress_unfrozen", "skill_in_system",
         "skill_in_messages", "skill_switch_system", "skill_switch_messages", "date_in_system", "date_in_messages",
         "reasoning_stripped", "world_state_diff", "world_state_rerender", "catalogue_in_prefix", "catalogue_diff",
         "skill_reread", "tools_deferred", "tools_deferred_schema", "session_env_in_system", "session_env_message"]  # fmt: skip
AGENT_REPLAYED = ["append_only", "text_stable"]  # the replayed-replies pair row
AGENT_STACKS = ("qwen3-append", "llama3.1")
TIMED = ["append_only", "naive", "timestamp_start", "timestamp_end", "tools_reordered", "sliding_window",
         "status_append"]  # fmt: skip


# Why a pattern has no run under Llama 3.1's template (the agent-scale table says so in the row).
NOT_ON_LLAMA = {
    "timestamp_end_tools_first": "Llama 3.1's template puts the tools in the first user message, after the "
    "system text: there is no system-then-tools block to reorder",
    "timestamp_tool": "Llama 3.1 takes one tool call per message, and the time call joins steps that already "
    "call tools",
    "reasoning_stripped": "Llama 3.1's template renders no reasoning, so both arms are the same requests (its "
    "coding run stays as that control)",
}


def _applies(stack: str, workload: str, pattern: str) -> bool:
    if stack == "llama3.1" and (workload == "fanout" or pattern in NOT_ON_LLAMA):
        # the coding session's reasoning_stripped run under Llama 3.1 predates this list: kept as a control
        return workload == "coding" and pattern == "reasoning_stripped"
    return True


def token_jobs(full: bool, quick: bool, stacks: tuple[str, ...] = REAL_STACKS) -> list[Job]:
    """The token-exact jobs for ``stacks`` (``smollm2``: the target model's own tokenizer, e.g. a
    ``--model`` hybrid)."""
    if quick:
        return [Job("coding", "default", s, p, "cached") for s in stacks
                for p in ("append_only", "timestamp_start", "tools_reordered", "sliding_window", "status_replace",
                          "status_append")]  # fmt: skip
    groups = [("coding", CODING), ("research", RESEARCH), ("fanout", FANOUT)]
    jobs = [
        Job(w, "default", s, p, "cached") for w, ps in groups for s in stacks for p in ps if _applies(s, w, p)
    ]
    # the agent session: through the engine's reuse rule by default, through the engine with --full
    agent = [Job("agent", "default", s, p, "cached") for s in stacks if s in AGENT_STACKS for p in AGENT
             if _applies(s, "agent", p)]  # fmt: skip
    jobs += agent + [Job("agent", "default", s, p, "replayed") for s in stacks if s in AGENT_STACKS
                     for p in AGENT_REPLAYED]  # fmt: skip
    if MAIN_STACK in stacks:
        jobs += [Job("coding", "default", MAIN_STACK, p, "replayed") for p in ("append_only", "status_replace",
                                                                              "status_append", "text_stable")]  # fmt: skip
        sweep = sweep_jobs()
        jobs += sweep + contrast_jobs(jobs + sweep) + exp23_jobs()
    jobs += [j._replace(prefix_cache="off") for j in agent if j.stack != MAIN_STACK]  # both tokenizers
    return jobs


def contrast_jobs(jobs: list[Job]) -> list[Job]:
    """The cache-off contrast: every main-stack job with cached replies again on an engine whose prefix
    cache is off (naive already is cache-off)."""
    return [j._replace(prefix_cache="off") for j in jobs
            if j.stack == MAIN_STACK and j.replies == "cached" and j.pattern != "naive"]  # fmt: skip


def exp23_jobs() -> list[Job]:
    return [
        Job("coding", "quick", MAIN_STACK, p, "cached", "radix", page) for page in (0, 256) for p in EXP23
    ]


def sweep_jobs() -> list[Job]:
    """The status-bar sweep: replace vs append at four status sizes, over sessions of 10, 12 and 65."""
    from kvreuse.benchmarks.patterns.sweep import SIZES

    workloads = ["coding", "research", "agent"]
    return [Job(w, "default", MAIN_STACK, f"status_{mode}_{n}", "cached") for w in workloads for n in SIZES
            for mode in ("replace", "append")]  # fmt: skip


def timed_jobs(quick: bool) -> list[Job]:
    names = TIMED[:4] if quick else TIMED
    return [Job("coding", "quick", "smollm2", p, "replayed") for p in names]
