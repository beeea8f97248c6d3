"""The cache holds an assistant turn as the client will resend it, not only as it was generated.

A client that resends the history (every chat-completions agent; Responses with ``store: false`` or
resent items) gets the finished turn rendered by the template from its parsed message, and that
rendering need not be the generated tokens: the model (or the tool-call grammar) split the same text
into other tokens (``"}`` + ``}`` where the rendering tokenises ``"`` + ``}}``), the forced call
prefix was tokenised apart from what followed it (`` `` + ``{"`` against `` {"``), or the template
writes the markup in another order (harmony's ``to=functions.X`` after ``<|channel|>commentary``,
rendered in the role header).  Each of these cost the next turn everything after the break.

Why re-render rather than force canonical tokens while generating: only the first of the three is a
choice of tokens the grammar could forbid (and only where the text after it is forced); the other
two are text the template, not the model, decides.  So when a chat run ends, the conversation with
its answer appended is rendered as the next request will render it (``history_ids``) and, where
that differs from prompt + output before the output's last token, those tokens are prefilled in the
background under the request's own cache scope (``rewarm``): the next turn reads them from the
cache.  The KV is an ordinary prefill of those tokens, so the cache stays equal to no cache; the
cost is the tokens after the break, paid while the client runs its tools instead of in the next
request's time to first token.  The generated form stays cached too, for a client that continues
it (``previous_response_id``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kvreuse.chat_templates.render import first_divergence, render_text
from kvreuse.chat_templates.tool_calls import ParsedOutput
from kvreuse.runtime.request import CacheScope
from kvreuse.runtime.sampling.params import SamplingParams
from kvreuse.runtime.server.state import ServerState

log = logging.getLogger("kvreuse.server")


def assistant_message(parsed: ParsedOutput) -> dict[str, Any]:
    """A parsed output as an OpenAI assistant message: the chat answer, a Responses conversation's
    turn, and the message a client resends (so the one this module renders)."""
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": parsed.content or (None if parsed.tool_calls else ""),
    }
    if parsed.reasoning:
        msg["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        msg["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in parsed.tool_calls
        ]
    return msg


# two contents of the message after the answer (JSON and prose, as tool results and user messages
# start): the tokens both renderings share are what the next request renders, whatever it says
PROBES = ('{"kvreuse": 0}', "kvreuse")


def history_ids(
    state: ServerState, messages: list[dict], tools: list[dict] | None, parsed: ParsedOutput, kwargs: dict
) -> list[int] | None:
    """Token ids of ``messages`` + the answer, rendered as the next request will render them: with a
    message after it (the calls' results, else a user message; a template may render the last
    assistant turn otherwise, e.g. Qwen3's empty think block), up to where two contents of that
    message part (a token that merges with the content's first characters is left to the next
    request).  None where the template refuses that conversation."""
    answer = assistant_message(parsed)
    calls = answer.get("tool_calls") or []

    def ids(content: str) -> list[int]:
        follow = [{"role": "tool", "tool_call_id": c["id"], "content": content} for c in calls]
        msgs = [*messages, answer, *(follow or [{"role": "user", "content": content}])]
        text = render_text(state.tokenizer, msgs, tools, template=state.template.source, **kwargs)
        return list(state.tokenizer(text, add_special_tokens=False)["input_ids"])

    try:
        a, b = (ids(p) for p in PROBES)
    except Exception as e:  # a template's raise_exception: nothing to warm, the next turn says why
        log.debug("no re-rendered history: %s", e)
        return None
    return a[: first_divergence(a, b)]


def break_point(generated: list[int], rendered: list[int]) -> int | None:
    """Where ``rendered`` leaves the generated sequence's computed part (all but its last token:
    the last sampled token is never computed), or None when it only extends it."""
    at = first_divergence(generated, rendered)
    return at if at < len(generated) - 1 and at < len(rendered) else None


def resend_break(
    state: ServerState,
    messages: list[dict],
    tools: list[dict] | None,
    parsed: ParsedOutput,
    kwargs: dict,
    generated: list[int],
) -> list[int] | None:
    """The turn as the client will resend it (``history_ids``) where that breaks from ``generated``
    (prompt + output), else None: what ``rewarm`` prefills (the server; the agents' replay mirrors it)."""
    rendered = history_ids(state, messages, tools, parsed, kwargs)
    return rendered if rendered is not None and break_point(generated, rendered) is not None else None


async def rewarm(
    state: ServerState,
    scope: CacheScope,
    job: Callable[[], list[int] | None],
    record: Callable[[list[int]], None],
) -> None:
    """Render (``job()`` -> ``resend_break``'s ids, on a prep thread of the request's tenant) and, at a
    break, prefill them under ``scope`` (one token generated, dropped).  ``record`` keeps them in the
    tenant's diagnosis history.  Counted in ``state.background.counts``: ``rewarm`` prefills and
    ``rewarm_tokens`` they computed."""
    try:
        rendered = await state.prep.run(scope.namespace, job)
        if rendered is None:
            return
        req = state.engine.make_request(rendered, SamplingParams(max_tokens=1, temperature=0.0), None, scope)
        async for out in state.aengine.stream(req):
            if out.finished:
                state.background.counts["rewarm"] += 1
                state.background.counts["rewarm_tokens"] += out.prefilled_tokens
        record(rendered)  # the diagnosis compares the next turn with this form
    except Exception as e:  # a full pool, a prep share taken, a shutdown: the next turn prefills instead
        log.info("re-rendered turn not prefilled: %s", e)
