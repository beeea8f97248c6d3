"""A recorded agent session replayed through the pattern benchmark's target (``InProcessTarget``,
``benchmarks/patterns/targets.py``) with the prefix cache on and off: the naive baseline beside it.

Each recorded model request is rendered exactly as the server rendered it (the same protocol
conversion, chat template and forced reasoning prefix), and its reply is the same script step forced
through the engine, so the replay's token streams are the live session's; after each reply the turn is
re-rendered as the client will resend it and prefilled where that breaks from the generated tokens, as
the server does (``runtime/server/core/rerender.py``); cache on must then find the live server's cached
tokens (``matches_live`` says whether it did, request by request).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kvreuse.benchmarks.agents.analyze import chat_records
from kvreuse.benchmarks.agents.model import agent_model_dir
from kvreuse.benchmarks.patterns.targets import InProcessTarget
from kvreuse.chat_templates.parsers import parse_full
from kvreuse.runtime.server.anthropic.convert import convert
from kvreuse.runtime.server.anthropic.protocol import MessagesRequest
from kvreuse.runtime.server.core.prompting import ChatPrompt, build_chat_prompt, render_kwargs
from kvreuse.runtime.server.core.rerender import resend_break
from kvreuse.runtime.server.openai.responses_prompt import build_prompt, chat_input
from kvreuse.runtime.server.openai.responses_protocol import ResponsesRequest
from kvreuse.runtime.server.scripted import ScriptedReplies
from kvreuse.runtime.server.templates import resolve_template


def render(rec: dict, tokenizer: Any, template: Any, max_len: int) -> tuple[Any, ChatPrompt]:
    """The request's chat input and prompt, as the server built them."""
    if rec["path"] == "/v1/messages":
        chat = convert(MessagesRequest.model_validate(rec["request"])).chat
        return chat, build_chat_prompt(chat, tokenizer, template)
    req = ResponsesRequest.model_validate(rec["request"])
    chat = chat_input(req, template, None)
    return chat, build_prompt(chat, None, tokenizer, template, max_len, req.truncation == "auto")


def rewarm(engine: Any, state: Any, chat: Any, p: ChatPrompt, reply: list[int]) -> None:
    """The server's prefill of a finished turn as the client will resend it (``ChatRun.warm_history``)."""
    from kvreuse.runtime.sampling.params import SamplingParams

    text = state.tokenizer.decode(reply, skip_special_tokens=True)
    parsed = parse_full(p.forced_prefix + text, p.tool_format, state.template.reasoning, p.think_open)
    rendered = resend_break(
        state, p.messages, p.tools, parsed, render_kwargs(chat), list(p.token_ids) + list(reply)
    )
    if rendered is not None:
        engine.generate([rendered], SamplingParams(max_tokens=1, temperature=0.0))


def replay(session: dict[str, Any], page: int = 16, max_len: int = 65536) -> dict[str, Any]:
    """Prefilled tokens per request with the cache on and off (scripted replies, the same engine)."""
    from kvreuse.runtime.engine.engine import Engine

    engine = Engine(str(agent_model_dir()), kv_cache_memory="512M", max_model_len=max_len, page_size=page)
    tok, template = engine.tokenizer, resolve_template(engine.tokenizer, "qwen3")
    script = session["script"]
    out: dict[str, Any] = {}
    for mode, cache in (("cache_on", True), ("cache_off", False)):
        replies = ScriptedReplies.from_dict(script)
        target, rows = InProcessTarget(engine, reply_kv="extend"), []  # one extend step writes a reply's KV
        target.reset()
        for rec in chat_records(session["records"]):
            chat, p = render(rec, tok, template, max_len)
            ids, _ = replies.reply_ids(p.messages, p.tools, render_kwargs(chat), p.rendered.text + p.forced_prefix,
                                       tok, template.source, engine.eos_ids)  # fmt: skip
            m = target.send(None, p.token_ids, cache, ids)
            if cache:
                rewarm(engine, SimpleNamespace(tokenizer=tok, template=template), chat, p, ids)
            live = (rec["result"].get("kvreuse") or {}).get("cache") or {}
            rows.append({"seq": rec["seq"], "prompt_tokens": m.prompt_tokens, "cached_tokens": m.cached_tokens,
                         "prefilled_tokens": m.prefilled_tokens,
                         "matches_live": (m.prompt_tokens, m.cached_tokens) == (live.get("prompt_tokens"), live.get("cached_tokens"))
                         if cache else m.prompt_tokens == live.get("prompt_tokens")})  # fmt: skip
        out[mode] = {"rows": rows, "prefilled_tokens": sum(r["prefilled_tokens"] for r in rows),
                     "matches_live": sum(r["matches_live"] for r in rows)}  # fmt: skip
    on, off = out["cache_on"]["prefilled_tokens"], out["cache_off"]["prefilled_tokens"]
    out["savings_vs_naive"] = 1 - on / max(1, off)
    engine.close() if hasattr(engine, "close") else None
    return out
