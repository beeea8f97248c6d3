"""``POST /v1/responses``: one Responses request as a core chat run, answered as a response object.

The run is built complete in the prep thread like every chat run; what is Responses' own: the prompt
may continue a stored response (``responses_prompt.py``), a stored response's scope pins its whole
sequence under its own pin owner, and the finished response is stored (``store``) for the next turn.
"""

from __future__ import annotations

from typing import Any

from kvreuse.runtime.engine.outputs import RequestOutput
from kvreuse.runtime.request import CacheScope
from kvreuse.runtime.sampling.constrained import Grammar, json_object, json_schema
from kvreuse.runtime.sampling.params import SamplingParams
from kvreuse.runtime.server.core import chat_run
from kvreuse.runtime.server.core.prompting import ChatInput, ChatPrompt
from kvreuse.runtime.server.core.run import Caller
from kvreuse.runtime.server.errors import bad_request
from kvreuse.runtime.server.openai.responses_items import input_items
from kvreuse.runtime.server.openai.responses_prompt import build_prompt, chat_input
from kvreuse.runtime.server.openai.responses_protocol import ResponsesRequest
from kvreuse.runtime.server.openai.responses_store import ResponseStore, StoredResponse, pin_owner
from kvreuse.runtime.server.state import ServerState


class StoredScope:
    """The caller, except that a stored response's pin is its own (``pin_owner``), not the session's."""

    def __init__(self, caller: Caller, tenant: str | None, run: ResponsesRun) -> None:
        self.caller, self.tenant, self.run = caller, tenant, run

    def scope(self, session: str | None, prompt: Any = None) -> CacheScope:
        scope = self.caller.scope(session, prompt)
        return scope._replace(session=pin_owner(self.tenant, self.run.id))


def text_grammar(req: ResponsesRequest) -> Grammar | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    return json_object() if fmt.type == "json_object" else json_schema(fmt.schema_ or {})


class ResponsesRun(chat_run.ChatRun):
    """One Responses request in flight (one choice)."""

    def __init__(self, state: ServerState, caller: Any, req: ResponsesRequest, store: ResponseStore) -> None:
        self.req, self.store, self.tenant = req, store, caller.tenant
        self.previous: StoredResponse | None = None
        if req.previous_response_id is not None:
            self.previous = store.get(req.previous_response_id, self.tenant, "previous_response_id")
        chat = chat_input(req, state.template, self.previous)
        self.chat = chat
        scoped = StoredScope(caller, self.tenant, self) if req.store else caller
        super().__init__(state, scoped, chat, "resp", 1, self.make_params, text_grammar(req),
                         req.prompt_cache_key or req.user)  # fmt: skip

    def build_prompt(self, state: ServerState, chat: ChatInput) -> ChatPrompt:
        auto = self.req.truncation == "auto"
        return build_prompt(
            chat, self.previous, state.tokenizer, state.template, state.engine.max_model_len, auto
        )

    def make_params(self, prompt_len: int, choice: int) -> SamplingParams:
        req, engine = self.req, self.state.engine
        max_tokens = req.max_output_tokens or max(1, engine.admission.token_capacity - prompt_len)
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                seed=req.seed,
            )
        except ValueError as e:
            raise bad_request(str(e)) from None

    # -- the response object -------------------------------------------------------------------------
    def status(self, out: RequestOutput | None) -> tuple[str, dict[str, str] | None]:
        if out is None:
            return "in_progress", None
        if out.finish_reason == "abort":
            return "cancelled", None
        if out.finish_reason == "length":
            return "incomplete", {"reason": "max_output_tokens"}
        return "completed", None

    def usage(self, out: RequestOutput, reasoning: str) -> dict[str, Any]:
        prompt, output = len(self.prompt_ids), len(out.output_token_ids)
        reasoning_tokens = (
            len(self.state.tokenizer.encode(reasoning, add_special_tokens=False)) if reasoning else 0
        )
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": int(out.cached_tokens or 0)},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, output)},
            "total_tokens": prompt + output,
            **self.clamp_usage(),
        }

    def body(
        self, output: list[dict], out: RequestOutput | None = None, reasoning: str = ""
    ) -> dict[str, Any]:
        req = self.req
        status, incomplete = self.status(out)
        fmt = req.text.format if req.text is not None and req.text.format is not None else None
        choice = req.tool_choice or "auto"
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "background": False, "error": None, "incomplete_details": incomplete,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "model": self.model,
            "output": output, "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
            "store": req.store, "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
            "tool_choice": choice if isinstance(choice, str) else choice.model_dump(),
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "top_p": 1.0 if req.top_p is None else req.top_p, "truncation": req.truncation,
            "usage": None if out is None else self.usage(out, reasoning), "user": req.user,
            "metadata": req.metadata or {},
        }  # fmt: skip

    def finish_response(
        self, out: RequestOutput, output: list[dict], message: dict[str, Any]
    ) -> dict[str, Any]:
        """The final response object; stored (with the whole token sequence, kept as what it adds to the
        response it continues) when the request asks."""
        body = self.body(output, out, message.get("reasoning_content") or "")
        body["kvreuse"] = self.finish([out])
        if self.req.store and body["status"] != "cancelled":
            stored = self.store.put(StoredResponse(
                self.id, self.tenant, body, self.req.instructions, self.chat.tools,
                dict(self.chat.template_kwargs or {}), (self.prompt.asked or self.prompt.messages) + [message],
                list(out.prompt_token_ids) + list(out.output_token_ids), input_items(self.req),
            ), parent=self.req.previous_response_id)  # fmt: skip
            if not stored:  # the answer is served, as not stored; its pin would only hold pages for nothing
                body["store"] = False
                owner, engine = pin_owner(self.tenant, self.id), self.state.engine
                engine.call_between_steps(lambda: engine.cache.unpin(owner))
        return body

    def cancel(self) -> None:
        for r in self.requests:
            self.state.engine.abort(r.request_id)
