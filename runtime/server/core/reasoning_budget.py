"""A reasoning budget (Anthropic's ``thinking.budget_tokens``): the reasoning is capped at that many
tokens, then closed, and the answer follows.

How: the choice first runs with ``max_tokens = min(budget, max_tokens)``.  If it ended for any other
reason than that cap (end of turn, a stop sequence) it is the answer as it stands.  If the cap cut
it while the request allows more tokens, the engine continues in a second request whose prompt is
the first one's prompt + its output, plus ``CLOSE`` (the template's end of reasoning) when the
reasoning is still open: the model then writes the answer, with the remaining ``max_tokens``.  The
second prompt extends the first, so it is read from the prefix cache (only the pages of the first
output that were not complete are recomputed).

The client sees one output: the deltas of both runs with ``CLOSE`` between them, and one final
output whose tokens, text and cache figures are the first run's prompt's (usage stays exact:
``output_tokens`` counts both runs' tokens and the ``CLOSE`` tokens).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

from kvreuse.chat_templates.parsers import THINK_CLOSE
from kvreuse.runtime.engine.outputs import RequestOutput
from kvreuse.runtime.sampling.params import SamplingParams

CLOSE = "\n" + THINK_CLOSE + "\n\n"


class BudgetReport(NamedTuple):
    """What the budget did to one choice (the ``kvreuse.reasoning`` extension)."""

    budget: int
    first_tokens: int  # tokens of the first run (the reasoning, and the answer if it closed itself)
    closed_by: (
        str  # "model" (closed or ended within budget), "budget" (CLOSE appended), "max_tokens" (no room)
    )
    continued: bool  # a second run wrote the rest


async def budgeted_stream(
    run: Any, index: int, params: SamplingParams, budget: int, reports: dict[int, BudgetReport]
) -> AsyncIterator[RequestOutput]:
    """Choice ``index`` of ``run`` (a ``ChatRun``) under ``budget``; fills ``reports[index]``."""
    aengine, rid, prompt = run.state.aengine, f"{run.id}-{index}", run.prompt_of(index)
    t0 = time.perf_counter()
    first = run.requests[index].params  # the run built this phase's request, capped at the budget
    last: RequestOutput | None = None
    async for out in aengine.stream(run.requests[index]):
        if out.finished:
            last = out
        else:
            yield out
    assert last is not None
    closed = THINK_CLOSE in run.prompt.forced_prefix + last.text
    close_ids = [] if closed else run.state.tokenizer.encode(CLOSE, add_special_tokens=False)
    left = params.max_tokens - len(last.output_token_ids) - len(close_ids)
    if last.finish_reason != "length" or first.max_tokens == params.max_tokens or left < 1:
        ended = "model" if closed or last.finish_reason != "length" else "max_tokens"
        reports[index] = BudgetReport(budget, len(last.output_token_ids), ended, False)
        yield last
        return
    reports[index] = BudgetReport(budget, len(last.output_token_ids), "model" if closed else "budget", True)
    close = CLOSE if close_ids else ""
    yield last._replace(finished=False, finish_reason=None, output_token_ids=[], text="", logprobs=[])
    if close:
        yield last._replace(new_token_ids=close_ids, delta=close, new_logprobs=[], finished=False,
                            finish_reason=None, output_token_ids=[], text="", logprobs=[])  # fmt: skip
    head = list(prompt) + list(last.output_token_ids) + close_ids
    second = dataclasses.replace(params, max_tokens=left)
    answer = run.state.engine.make_request(head, second, f"{rid}-answer", run.scope)
    async for out in aengine.stream(answer):
        if not out.finished:
            yield out
            continue
        # one output for the whole choice: the first run's prompt and cache figures, both runs' tokens
        yield out._replace(
            prompt_token_ids=last.prompt_token_ids, cached_tokens=last.cached_tokens,
            prefilled_tokens=last.prefilled_tokens, ttft_s=last.ttft_s, prefill_s=last.prefill_s,
            decode_s=(last.decode_s or 0.0) + (out.decode_s or 0.0), e2e_s=time.perf_counter() - t0,
            output_token_ids=list(last.output_token_ids) + close_ids + list(out.output_token_ids),
            text=last.text + close + out.text, logprobs=[],
            cached_host_tokens=last.cached_host_tokens, cached_disk_tokens=last.cached_disk_tokens,
            cached_shared_tokens=last.cached_shared_tokens,
            snapshot_cut=last.snapshot_cut,
        )  # fmt: skip
