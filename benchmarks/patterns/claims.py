"""Every checkable claim of the seeds (``shared/seeds``), each with the rule that judges it.

Seeds: [000] a product's context-management guide (request layout in 14 segments, World State full +
diffs, capability toggles, compaction); [001] an analysis of Claude Code's context (static / dynamic
system prompt, deferred tools, ``<system-reminder>`` messages, sub-agents with their own prompt);
[003] a book chapter on context engineering (KV-cache-friendly design, Experiment 2-3, skills, status
bar, five compression layers, sub-agent isolation).  Section names are the seeds' own headings.
"""

from __future__ import annotations

from kvreuse.benchmarks.patterns.claims_compression import COMPRESSION_CLAIMS
from kvreuse.benchmarks.patterns.claims_coverage import COVERAGE_CLAIMS
from kvreuse.benchmarks.patterns.claims_extra import EXTRA_CLAIMS
from kvreuse.benchmarks.patterns.claims_measured import MEASURED_CLAIMS, SUB_FLOPS
from kvreuse.benchmarks.patterns.verdicts import (
    AllOf,
    Contrast,
    Invalidates,
    NotMeasurable,
    Reaches,
    Runs,
    Same,
    Verdict,
    sub_prefilled,
)

S003_KV = "003 §KV Cache 友好的上下文设计"
S003_EXP = "003 §实验 2-3 常见的错误上下文管理模式"
S003_SKILL = "003 §Skills 的实现方式与权衡"
S003_STATUS = "003 §状态更新的两种实现与缓存代价"
S003_COMP = "003 §压缩与 KV Cache / 生产级的分层压缩机制"
S003_CC = "003 §缓存作为架构约束"
S001_PREFIX = "001 §前缀匹配"
S001_ORDER = "001 §上下文全景"
S000_TOOLS = "000 §模型请求怎样组装 (tools)"
S000_CAPS = "000 §能力开关与缓存"

CACHE_CLAIMS = [
    Reaches("Append-only context with a static prefix reuses everything", f"{S003_KV}; {S001_PREFIX}", "coding",
            "the only gap is page granularity (replies cached by forced decoding)"),
    Invalidates("A timestamp at the start of the system prompt invalidates the whole cache", S003_EXP, "coding",
                "timestamp_start", "reuse stops in the system prompt's first line; everything after it is recomputed"),
    # one claim ([003]: "put the time in a user message appended at the end, or fetch it by a tool call only
    # when needed"), two ways to follow it: one row, each way a part (issue 57: it was two rows)
    AllOf("Dynamic information (the time) goes last, not into the system prompt (here: its end): appended as a "
          "new message each turn, or fetched by a tool call when needed", f"{S003_KV}; {S003_EXP}",
          (Contrast("as a new message", S003_KV, "coding", "timestamp_message", "timestamp_end",
                    "as a new message it extends the previous request"),
           Contrast("by a tool call", S003_EXP, "coding", "timestamp_tool", "timestamp_end",
                    "the tool call and its result are appended history")),
          "in the system prompt the timestamp precedes tools and history, so each turn recomputes them; as a new "
          "message, or a tool call and its result, it is appended history and nothing before it changes"),
    Contrast("Most stable part first: with the tools rendered before the system text (the seed's order is system "
             "-> tools -> messages), a change at the system text's end keeps the tools cached", f"{S001_ORDER}; {S003_KV}", "coding",
             "timestamp_end_tools_first", "timestamp_end",
             "with the tools first, a change at the end of the system text keeps the tool block cached"),
    Contrast("A live user-profile message near the start breaks the cache", S003_EXP, "coding", "append_only",
             "user_profile", "the static prefix is reused, the whole history after the profile is not"),
    Contrast("Reordering tools (e.g. by usage) breaks the cache", S003_EXP, "coding", "append_only",
             "tools_reordered", "reuse stops at the first moved tool; everything after it is recomputed"),
    Contrast("Stable tools sorted by name, dynamic tools after them (not sorted in among them)", S000_TOOLS,
             "coding", "tools_dynamic_after", "tools_dynamic_sorted_in",
             "after the stable tools the change starts later; in Qwen3's layout the tools precede the history, so "
             "connecting a tool server recomputes the history either way and only the tools between the two "
             "insertion points differ"),
    Contrast("Capability changes alter the reusable range: a withdrawn schema costs more than a message saying so",
             S000_CAPS, "coding", "tools_toggle_message", "tools_toggled",
             "each schema change recomputes everything after the tool block (off and on); the reminder is appended"),
    Contrast("A sliding window over the history breaks the prefix", S003_EXP, "coding", "append_only",
             "sliding_window", "every slide recomputes from the first kept message"),
    Contrast("A window that drops in blocks (half when full) breaks less often than one that slides per message",
             f"{S003_EXP} (our variant)", "coding", "sliding_window_block", "sliding_window",
             "it breaks once per half-window instead of every turn"),
    Contrast("USER:/ASSISTANT: text flattening is cache-neutral when byte-stable; only unstable formatting "
             "breaks the cache", S003_EXP, "coding", "text_stable", "text_unstable",
             "the stable flattening extends the previous request; [i/N] labels rewrite every entry"),
    # [003]'s claim is about the prompt's bytes: judged with replayed replies (no reply KV for either arm);
    # with cached replies the same pair measures another thing, named in the next row (issue 57)
    Same("Byte-stable text concatenation still hits the cache: its prefix is reused as the structured messages' "
         "is (replies replayed: no reply KV for either to lose)", S003_KV, "coding", "append_only", "text_stable",
         "with no reply KV to lose, the flattened history is a prefix of the next request as the structured one is",
         replies="replayed"),
    Contrast("...but flattening forfeits the replies' KV: each generated reply comes back as text inside the next "
             "user message (cached replies; a consequence the seed does not state)", S003_KV, "coding",
             "append_only", "text_stable",
             "each reply is generated as an assistant turn and rendered next as text inside the user message, so "
             "its KV is never reused: the flattening recomputes every reply"),
    Contrast("A status bar replaced every turn costs the turns after it; appended and never removed it costs "
             "nothing", S003_STATUS, "coding", "status_append", "status_replace",
             "removing the old status invalidates the reply generated after it, so each turn recomputes status + "
             "reply; appending keeps every reply cached"),
    Contrast("A status bar inside the system prompt breaks the whole prefix; at the end it does not",
             "003 §Agent 状态栏在上下文中的具体位置", "coding", "status_replace", "status_in_system",
             "in the system prompt every turn recomputes tools and history"),
    Contrast("Compress in batches near a threshold, not every turn", "003 §压缩与 KV Cache", "research",
             "compress_budget", "compress_every_turn", "a moving stub boundary breaks the prefix on every request"),
    Contrast("Tool-result replacement strings are frozen when first made", S003_CC, "research", "compress_budget",
             "compress_unfrozen", "a stub re-rendered each turn breaks the prefix at the oldest stub every turn"),
    # one claim in tokens and in compute: one row (issue 57: the compute part was row 32, apart)
    AllOf("Sub-agents byte-aligned with the parent reuse its cache; with their own system prompt (same tools) "
          "they do not, and cost more compute, though the aligned ones carry the parent's whole prefix",
          f"{S003_CC} vs 001 §Subagent 的系统提示词",
          (Contrast("reuse", S003_CC, "fanout", "append_only", "subagent_own_system",
                    "aligned sub-agents share the parent's whole static prefix and prefill only their own turns",
                    sub_prefilled, "sub-agent prefilled"),
           SUB_FLOPS),
          "aligned sub-agents share the parent's whole static prefix and prefill only their own turns; an own "
          "prompt is computed once per sub-agent, which outweighs the attention over the longer aligned contexts"),
    Contrast("A skill loaded into the system prompt breaks the cache; delivered as a message it does not",
             f"{S003_SKILL}; 000 §换轮时哪些内容会延续 (a skill activated later stays where it happened)", "coding", "skill_in_messages", "skill_in_system",
             "the system prompt precedes tools and history, so loading the skill there recomputes all of it"),
    Contrast("Switching skills repeatedly in the system prompt invalidates the cache each time", S003_SKILL,
             "coding", "skill_switch_messages", "skill_switch_system",
             "every switch rewrites the system prompt and recomputes tools and history; as messages each load is "
             "appended"),
    Contrast("A date-only reminder belongs in the messages, not the system prompt",
             "001 §AGENTS.md (system-reminder)", "coding", "date_in_messages", "date_in_system",
             "in the system prompt the day change recomputes the whole context once"),
    Contrast("Rewriting old history (Qwen3's stock template strips old reasoning) breaks the prefix",
             "001 §前缀匹配 (已有的内容只追加不修改)", "coding", "append_only", "reasoning_stripped",
             "the stripped think blocks were generated and cached; at the next user query they disappear and "
             "everything after the first one is recomputed"),
]  # fmt: skip

NOT_MEASURABLE = [
    NotMeasurable("Text formatting (USER:/ASSISTANT:) degrades tool use: repeated actions, ignored results",
                  S003_EXP, "behavioural: needs a trained model run over tool-use tasks (pass rate and repeated "
                  "calls, structured vs flattened history); the tiny random models here only count tokens"),
    NotMeasurable("A sliding window makes agents loop, re-running tool calls whose results slid out", S003_EXP,
                  "behavioural: needs a real agent on long tasks (repeated identical calls per session); partly measurable "
                  "here: how many later turns cite a tool result that has slid out of the window (the precondition), "
                  "not built"),
    NotMeasurable("A fixed tool order barely affects the model's tool choice", S003_EXP,
                  "behavioural: needs tool-selection accuracy of a real model under shuffled vs fixed order"),
    NotMeasurable("Raw timestamps alone do not change an agent's pacing; a usage manual lifts pass rates by 19-49 "
                  "points (time sense)", "003 §从读数到策略：Agent 的物理时间感知",
                  "behavioural: needs the time-sense benchmark the chapter cites, with a real model"),
    NotMeasurable("Skill descriptions written as routing conditions with counter-examples route more accurately",
                  "003 §Skills（第一层元数据）", "behavioural: needs skill-routing accuracy of a real model over "
                  "a labelled task set"),
    NotMeasurable("Instructions injected mid-context (a skill read as a file) are followed less reliably than in "
                  "the system prompt, depending on the model", S003_SKILL,
                  "behavioural: needs instruction-following scores by position with real models"),
    NotMeasurable("Context rot: decision quality falls as irrelevant content grows, before the window is full",
                  "003 §为什么需要压缩", "behavioural: needs a long-context retrieval/decision benchmark with a "
                  "real model at several fill levels"),
    NotMeasurable("Summaries lose detail, so an agent may 'forget' after compaction", "000 §为什么 Agent 仍可能“忘记”",
                  "behavioural: needs task success after compaction with a real summariser and model; {row:Identifiers (UUIDs} measures the "
                  "part a text check can (identifiers lost through compression)"),
    NotMeasurable("AGENTS.md is kept out of the system prompt for permission isolation (prompt-injection risk)",
                  "001 §AGENTS.md", "security: needs an injection benchmark with a real model"),
    NotMeasurable("KV entries of a field carry under 1% of its influence; most lives in downstream 'notes', so "
                  "caches could be edited and composed", "003 §KV Cache 未必是一次性的",
                  "a research result about model internals: needs a trained model and attribution measurements; "
                  "no production engine (this one included) reuses KV past a changed token"),
    NotMeasurable("Reusing an old attachment reference does not free the image's context", "000 §能力开关与缓存",
                  "the workloads carry no images (text-only engine); the server could count the tokens an image reference "
                  "keeps in the context, not built"),
]  # fmt: skip

CLAIMS = [
    *CACHE_CLAIMS,
    *EXTRA_CLAIMS,
    *MEASURED_CLAIMS,
    *COMPRESSION_CLAIMS,
    *COVERAGE_CLAIMS,
    *NOT_MEASURABLE,
]


def verdicts(runs: list[dict]) -> list[Verdict]:
    """Every claim's verdict on these runs (claims whose runs are missing are left out)."""
    R = Runs(runs)
    return [v for check in CLAIMS if (v := check(R)) is not None]
