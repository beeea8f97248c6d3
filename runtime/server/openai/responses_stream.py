"""The Responses API's streamed events, in the order the official client accumulates them.

``response.created``, ``response.in_progress``, then one output item at a time (``output_item.added``;
a message's ``content_part.added``, ``output_text.delta``s, ``output_text.done``,
``content_part.done``; a reasoning item's ``reasoning_text.delta``s and ``.done``; a function
call's ``function_call_arguments.delta`` and ``.done``; then ``output_item.done``), and
``response.completed`` (``response.incomplete`` when cut by ``max_output_tokens``) with the whole
response.  Every event names its ``type`` in the SSE ``event:`` line too and has a ``sequence_number``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from kvreuse.chat_templates.tool_calls import ParsedDelta, ParsedOutput, ToolCall
from kvreuse.runtime.engine.async_engine import EngineDead, RequestFailed
from kvreuse.runtime.engine.outputs import RequestOutput
from kvreuse.runtime.server.core.streaming import join_parsed
from kvreuse.runtime.server.openai.messages import assistant_message
from kvreuse.runtime.server.openai.responses_input import call_item, message_item, reasoning_item
from kvreuse.runtime.server.openai.responses_run import ResponsesRun

log = logging.getLogger("kvreuse.server")


def error_fields(e: Exception) -> dict[str, Any]:
    """An error's ``code`` and ``message``: the engine's own words for its failures, else nothing of the
    exception (its text can name the server's paths; the log has it)."""
    code = {EngineDead: "engine_dead", RequestFailed: "request_failed"}.get(type(e), "server_error")
    message = str(e) if code != "server_error" else "internal server error"
    return {"code": code, "message": message, "param": None}


def error_events(e: Exception, seq: int = 0) -> list[str]:
    """An error after the stream began: the Responses ``error`` event (the client raises it), numbered
    after the events already sent when ``stream_events`` reports it."""
    obj = {"type": "error", **error_fields(e), "sequence_number": seq}
    return [f"event: error\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n"]


class EventWriter:
    """Numbers the events and keeps the output items open/closed as the parsed output arrives."""

    def __init__(self, run: ResponsesRun) -> None:
        self.run, self.seq = run, 0
        self.items: list[dict[str, Any]] = []  # finished items, in output order
        self.open: dict[str, Any] | None = None  # the item being streamed: {"kind", "id", "text"}
        self.content, self.reasoning, self.calls = "", "", []
        self.response: dict[str, Any] | None = None  # the final response object, once finished

    def event(self, kind: str, **fields: Any) -> str:
        obj = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n"

    def _start(self, kind: str, item: dict[str, Any]) -> list[str]:
        out = self.close()
        item = {**item, "id": f"{item['id']}_{len(self.items)}"}  # ids by output index, known only now
        self.open = {"kind": kind, "id": item["id"], "text": ""}
        out.append(self.event("response.output_item.added", output_index=len(self.items), item=item))
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self.event("response.content_part.added", item_id=item["id"], output_index=len(self.items),
                                  content_index=0, part=part))  # fmt: skip
        return out

    def feed(self, parsed: ParsedDelta) -> list[str]:
        out: list[str] = []
        base = self.run.id
        if parsed.reasoning:
            if self.open is None or self.open["kind"] != "reasoning":
                out += self._start("reasoning", {**reasoning_item(f"rs_{base}", ""), "content": []})
            self.open["text"] += parsed.reasoning  # type: ignore[index]
            self.reasoning += parsed.reasoning
            out.append(self.event("response.reasoning_text.delta", item_id=self.open["id"],  # type: ignore[index]
                                  output_index=len(self.items), content_index=0, delta=parsed.reasoning))  # fmt: skip
        if parsed.content:
            if self.open is None or self.open["kind"] != "message":
                item = {**message_item(f"msg_{base}", "", "in_progress"), "content": []}
                out += self._start("message", item)
            self.open["text"] += parsed.content  # type: ignore[index]
            self.content += parsed.content
            out.append(self.event("response.output_text.delta", item_id=self.open["id"], output_index=len(self.items),  # type: ignore[index]
                                  content_index=0, delta=parsed.content, logprobs=[]))  # fmt: skip
        for call in parsed.tool_calls:
            item = call_item(f"fc_{base}", call.id, call.name, "", "in_progress")
            out += self._start("function_call", item)
            self.open.update(call_id=call.id, name=call.name)  # type: ignore[union-attr]
            self.calls.append(ToolCall(call.id, call.name, call.arguments_delta))
            if call.arguments_delta:
                self.open["text"] += call.arguments_delta  # type: ignore[index]
                out.append(self.event("response.function_call_arguments.delta", item_id=self.open["id"],  # type: ignore[index]
                                      output_index=len(self.items), delta=call.arguments_delta))  # fmt: skip
        return out

    def close(self, status: str = "completed") -> list[str]:
        """Finish the open item (its done events), if any."""
        item, self.open = self.open, None
        if item is None:
            return []
        i, text, out = len(self.items), item["text"], []
        if item["kind"] == "message":
            done = message_item(item["id"], text, status)
            part = done["content"][0]
            out.append(self.event("response.output_text.done", item_id=item["id"], output_index=i, content_index=0,
                                  text=text, logprobs=[]))  # fmt: skip
            out.append(self.event("response.content_part.done", item_id=item["id"], output_index=i,
                                  content_index=0, part=part))  # fmt: skip
        elif item["kind"] == "reasoning":
            done = reasoning_item(item["id"], text)
            out.append(self.event("response.reasoning_text.done", item_id=item["id"], output_index=i,
                                  content_index=0, text=text))  # fmt: skip
        else:
            done = call_item(item["id"], item["call_id"], item["name"], text, status)
            out.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                  name=item["name"], arguments=text))  # fmt: skip
        self.items.append(done)
        out.append(self.event("response.output_item.done", output_index=i, item=done))
        return out


async def output_events(run: ResponsesRun, w: EventWriter) -> AsyncIterator[str]:
    """Every event from ``response.created`` to the final one; the final response object is left in
    ``w.response``.  The streamed and the whole response both come from here, so their output items
    (order, ids, statuses) are the same whatever the output, a call cut by ``max_output_tokens`` too."""
    yield w.event("response.created", response=run.body([]))
    yield w.event("response.in_progress", response=run.body([]))
    parser = run.parser(0)
    final: RequestOutput | None = None
    run.store.running(run.id, run.tenant, run)
    try:
        async with aclosing(run.streams()) as outputs:
            async for _, out in outputs:
                parsed = parser.feed(out)
                if out.finished:
                    parsed, final = join_parsed(parsed, parser.finish()), out
                for e in w.feed(parsed):
                    yield e
    finally:
        run.store.done(run.id)
    assert final is not None
    status = run.status(final)[0]
    if not w.items and w.open is None:  # nothing said: an empty message
        for e in w._start("message", {**message_item(f"msg_{run.id}", "", "in_progress"), "content": []}):
            yield e
    for e in w.close("incomplete" if status == "incomplete" else "completed"):
        yield e
    message = assistant_message(ParsedOutput(w.content, w.reasoning, w.calls))
    w.response = run.finish_response(final, w.items, message)
    kind = {"incomplete": "response.incomplete", "cancelled": "response.failed"}.get(
        status, "response.completed"
    )
    yield w.event(kind, response=w.response)


async def stream_events(run: ResponsesRun) -> AsyncIterator[str]:
    w = EventWriter(run)
    try:
        async with aclosing(output_events(run, w)) as events:
            async for e in events:
                yield e
    except Exception as e:  # the error event carries the next sequence number, not 0
        if isinstance(e, EngineDead | RequestFailed):
            log.error("stream %s ended: %s", run.id, e)
        else:
            log.exception("stream %s failed", run.id)
        for err in error_events(e, w.seq):
            yield err


async def complete(run: ResponsesRun) -> dict[str, Any]:
    """The whole response: the streamed events' final response, the events themselves dropped."""
    w = EventWriter(run)
    async with aclosing(output_events(run, w)) as events:
        async for _ in events:
            pass
    assert w.response is not None
    return w.response
