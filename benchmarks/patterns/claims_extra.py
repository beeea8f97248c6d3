"""Claims of [000] and [001] about the request layout, each a cache contrast of a like-with-like pair
(``layout.py``, ``sessions.py``)."""

from __future__ import annotations

from kvreuse.benchmarks.patterns.verdicts import Contrast


def new_sessions_first(run: dict) -> float:
    """Prefill of the first request of every session after the first, on a warm engine: the threads
    ``sessions.more_sessions`` adds after the workload's own (its sub-agents belong to session 0)."""
    from kvreuse.benchmarks.patterns.sessions import SESSION_TASKS

    threads = sorted({x["thread"] for x in run["requests"]})
    added = set(threads[-len(SESSION_TASKS) :]) if len(threads) > len(SESSION_TASKS) else set()
    firsts: dict[int, int] = {}
    for x in run["requests"]:
        if x["thread"] in added:
            firsts.setdefault(x["thread"], x["prefilled_tokens"])
    return sum(firsts.values())


EXTRA_CLAIMS = [
    Contrast("World State: one full snapshot per session and diffs where changes happen, not a full state "
             "re-rendered each turn", "000 §模型请求怎样组装 (segments 5, 11); §换轮时哪些内容会延续", "coding",
             "world_state_diff", "world_state_rerender",
             "a re-rendered state sits before the history, so each change recomputes everything after it; a diff "
             "is appended"),
    Contrast("A catalogue change (skills / collaboration directory) recorded where it happens, not rewritten in "
             "the stable prefix", "000 §能力开关与缓存 (segments 2-3)", "coding", "catalogue_diff",
             "catalogue_in_prefix", "rewriting the catalogue in place recomputes the history after it"),
    Contrast("Old history is merged verbatim (the skill text as it was then), never re-read from a changed file",
             "000 §换轮时哪些内容会延续", "coding", "skill_in_messages", "skill_reread",
             "re-reading the edited skill rewrites an old message, so everything after it is recomputed"),
    Contrast("Deferred tools listed by name, a found schema delivered as a message: the tools field never changes",
             "001 §延迟工具列表; §工具定义", "coding", "tools_deferred", "tools_deferred_schema",
             "adding the found schema to the tools recomputes the history after the tool block"),
    Contrast("The static zone is reused across sessions; session-specific content belongs after it",
             "001 §静态与动态的分离", "coding", "session_env_message", "session_env_in_system",
             "with the environment in the system prompt, each new session recomputes the tools; as a first "
             "message it leaves the whole static prefix shared", new_sessions_first, "new sessions' first-request prefill"),
]  # fmt: skip
