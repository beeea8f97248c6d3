"""A chat request in flight, whatever the protocol: its rendered prompt, the output parser, and the
bookkeeping at the end (cache diagnosis, metrics, the log line) that builds the ``kvreuse`` extension."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from kvreuse.chat_templates.harmony import HarmonyParser, parse_harmony
from kvreuse.chat_templates.parsers import OutputParser, parse_full
from kvreuse.chat_templates.tool_calls import ParsedDelta, ParsedOutput
from kvreuse.runtime.engine.outputs import RequestOutput
from kvreuse.runtime.sampling.constrained import Grammar
from kvreuse.runtime.sampling.params import SamplingParams
from kvreuse.runtime.server.core.constraints import tool_grammar
from kvreuse.runtime.server.core.prompting import ChatInput, ChatPrompt, build_chat_prompt, render_kwargs
from kvreuse.runtime.server.core.reasoning_budget import BudgetReport, budgeted_stream
from kvreuse.runtime.server.core.rerender import assistant_message, resend_break, rewarm
from kvreuse.runtime.server.core.run import Caller, EngineRun, MakeParams
from kvreuse.runtime.server.core.streaming import merge_streams
from kvreuse.runtime.server.diagnostics import HistoryEntry, cached_by_tier
from kvreuse.runtime.server.state import ServerState

log = logging.getLogger("kvreuse.server")


def with_stop_tokens(make_params: MakeParams, stops: list[int]) -> MakeParams:
    """``make_params`` whose params also stop at ``stops``."""

    def make(prompt_len: int, choice: int) -> SamplingParams:
        ps = make_params(prompt_len, choice)
        return dataclasses.replace(ps, stop_token_ids=sorted({*ps.stop_token_ids, *stops}))

    return make


def forced_params(make_params: MakeParams, forced: list[int]) -> MakeParams:
    """``make_params`` whose params emit exactly ``forced`` (no stop string may cut it short)."""

    def make(prompt_len: int, choice: int) -> SamplingParams:
        ps = make_params(prompt_len, choice)
        return dataclasses.replace(
            ps, forced_tokens=forced, max_tokens=len(forced), stop=[], ignore_eos=False
        )

    return make


class OutputFeed:
    """One choice's streaming parser, fed each engine output: a text parser its detokenised text
    (``text_feed``), harmony's its token ids (``token_feed``: its markers are special tokens, which
    the detokenizer drops from the text)."""

    def __init__(self, parser: OutputParser | HarmonyParser, read: Callable[[RequestOutput], Any]) -> None:
        self._parser, self._read = parser, read

    def feed(self, out: RequestOutput) -> ParsedDelta:
        return self._parser.feed(self._read(out))

    def finish(self) -> ParsedDelta:
        return self._parser.finish()


def text_feed(parser: OutputParser) -> OutputFeed:
    return OutputFeed(parser, lambda out: out.delta)


def token_feed(parser: HarmonyParser) -> OutputFeed:
    return OutputFeed(parser, lambda out: out.new_token_ids)


class ChatRun(EngineRun):
    """One chat request on the engine; ``grammar`` (e.g. a response format) applies unless the tool
    choice imposes its own."""

    def __init__(
        self,
        state: ServerState,
        caller: Caller,
        chat: ChatInput,
        id_prefix: str,
        n: int,
        make_params: MakeParams,
        grammar: Grammar | None = None,
        session: str | None = None,
    ) -> None:
        self.chat = chat
        self.prompt: ChatPrompt = self.build_prompt(state, chat)
        grammar = tool_grammar(chat, self.prompt.tool_format, state.tokenizer) or grammar
        self.scripted = self.scripted_reply(state, chat)
        if self.scripted is not None:  # the script chose the words: they are forced, not sampled
            make_params, grammar = forced_params(make_params, self.scripted[0]), None
        enc = state.template.harmony
        if enc is not None:  # a call ends the turn at <|call|>, an answer at <|return|>: whatever the EOS ids
            make_params = with_stop_tokens(make_params, enc.stop_tokens_for_assistant_actions())
        super().__init__(
            state, caller, id_prefix, [self.prompt.token_ids], n, make_params, grammar, session, self.prompt
        )
        self.budget_reports: dict[int, BudgetReport] = {}

    def build_prompt(self, state: ServerState, chat: ChatInput) -> ChatPrompt:
        """The prompt of ``chat``: rendered whole (a protocol that continues a stored sequence overrides it)."""
        return build_chat_prompt(chat, state.tokenizer, state.template)

    def scripted_reply(self, state: ServerState, chat: ChatInput) -> tuple[list[int], str] | None:
        p = self.prompt
        if (p.forced_prefix and p.reasoning_budget is None) or state.template.harmony is not None:
            return None  # a forced call header or harmony's token markup: not scriptable as text
        # an opened reasoning block (a budget's "<think>\n") is part of the prompt: the reply follows it
        return state.replies.reply_ids(p.messages, p.tools, render_kwargs(chat), p.rendered.text + p.forced_prefix,
                                       state.tokenizer, state.template.source, state.engine.eos_ids)  # fmt: skip

    def first_params(self, params: SamplingParams) -> SamplingParams:
        budget = self.prompt.reasoning_budget
        if budget is None:
            return params
        return dataclasses.replace(params, max_tokens=min(budget, params.max_tokens))

    def streams(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        budget = self.prompt.reasoning_budget
        if budget is None:
            return super().streams()
        return merge_streams(
            [budgeted_stream(self, i, p, budget, self.budget_reports) for i, p in enumerate(self.params)]
        )

    def parser(self, i: int) -> OutputFeed:
        """Choice ``i``'s streaming parser: ``feed`` each output, then ``finish``."""
        p, enc = self.prompt, self.state.template.harmony
        if enc is not None:
            harmony = HarmonyParser(enc, f"{self.id}-{i}", calls=p.tool_format is not None)
            harmony.feed(self.prefix_ids)  # the forced call header: held until its message ends
            return token_feed(harmony)
        parser = OutputParser(p.tool_format, self.state.template.reasoning, p.think_open, f"{self.id}-{i}")
        if p.forced_prefix:
            parser.feed(p.forced_prefix)  # markup only: the parser holds it, nothing is emitted
        return text_feed(parser)

    def parse(self, out: RequestOutput, i: int = 0) -> ParsedOutput:
        """The whole output of choice ``i`` as content, reasoning and tool calls."""
        p, enc = self.prompt, self.state.template.harmony
        if enc is not None:
            ids = self.prefix_ids + list(out.output_token_ids)
            return parse_harmony(enc, ids, f"{self.id}-{i}", calls=p.tool_format is not None)
        return parse_full(p.forced_prefix + out.text, p.tool_format, self.state.template.reasoning,
                          p.think_open, f"{self.id}-{i}")  # fmt: skip

    @property
    def prefix_ids(self) -> list[int]:
        """The forced prefix's token ids (the tail of the prompt), for a parser that reads ids."""
        n = self.prompt.prefix_tokens
        return list(self.prompt.token_ids[len(self.prompt.token_ids) - n :]) if n else []

    def warm_history(self, out: RequestOutput, options: dict[str, Any]) -> None:
        """The conversation with choice 0's answer, as the client will resend it, into the cache where
        it breaks from what was generated (``rerender.py``); a cut-off answer is not resent as is."""
        if out.finish_reason not in ("stop", "tool_calls") and not self.parse(out).tool_calls:
            return
        p, generated = self.prompt, list(self.prompt.token_ids) + list(out.output_token_ids)

        def job() -> list[int] | None:
            return resend_break(self.state, p.messages, p.tools, self.parse(out), dict(options), generated)

        def record(ids: list[int]) -> None:
            answer = assistant_message(self.parse(out))
            entry = HistoryEntry(ids, len(ids), [*p.messages, answer], p.tools, dict(options))
            self.state.diagnostics_for(self.scope.namespace).record(entry)

        self.state.background.start(rewarm(self.state, self.scope, job, record), self.scope.namespace)

    def finish(self, outs: list[RequestOutput]) -> dict[str, Any]:
        """Usage, diagnosis, metrics and the log line; returns the ``kvreuse`` extension object."""
        st, p = self.state, self.prompt
        first = outs[0]
        diagnostics = st.diagnostics_for(self.scope.namespace)
        options = render_kwargs(self.chat)
        diag = diagnostics.diagnose(
            p.rendered, p.messages, p.tools, p.token_ids, first.cached_tokens, first.snapshot_cut, options
        )
        self.details = {
            "cache": diag,
            "break": st.activity.break_detail(diagnostics, p.token_ids, p.messages, diag),
        }
        diagnostics.record(
            HistoryEntry(
                list(p.token_ids) + list(first.output_token_ids),
                len(p.token_ids),
                p.messages,
                p.tools,
                options,
            )
        )
        self.warm_history(first, options)
        diag["cached_by_tier"] = cached_by_tier(first)
        st.metrics.cache_miss.labels(diag["cause"]).inc()
        self.observe(outs)
        div = diag["divergence"] or {}
        log.info(
            "chat %s prompt=%d cached=%d reusable=%d cause=%s at=%s where=%s",
            self.id, diag["prompt_tokens"], diag["cached_tokens"], diag["reusable_tokens"], diag["cause"],
            div.get("token_index"), div.get("where"),
        )  # fmt: skip
        ext: dict[str, Any] = {"cache": diag}
        if self.clamp is not None:
            ext["max_tokens_clamped"] = self.clamp.report()
        if self.scripted is not None:
            ext["scripted"] = self.scripted[1]
        ext["speculative"] = {  # over the choices: tokens drafted and verified, and accepted
            "drafted_tokens": sum(o.drafted_tokens for o in outs),
            "accepted_tokens": sum(o.accepted_tokens for o in outs),
        }
        if self.budget_reports:
            ext["reasoning"] = [self.budget_reports[i]._asdict() for i in sorted(self.budget_reports)]
        return ext
