"""The grammar a chat request's output must follow: its tool_choice, else its response_format.

``tool_choice: "required"`` or a named tool with a template that has a tool-call format gets a tool-call
grammar for what follows the forced prefix (``templates.forced_tool_prefix``), so the call names one of
the tools and its arguments validate against that tool's ``parameters``.  ``"auto"`` stays free
generation, parsed afterwards.
"""

from __future__ import annotations

from runtime.constrained import Grammar, json_object, json_schema, tool_call
from runtime.server.protocol import ChatCompletionRequest, NamedToolChoice


def chat_grammar(req: ChatCompletionRequest, tool_format: str | None) -> Grammar | None:
    choice = req.tool_choice
    if (
        tool_format is not None
        and req.tools
        and (choice == "required" or isinstance(choice, NamedToolChoice))
    ):
        tools = [(t.function.name, t.function.parameters) for t in req.tools]
        forced = choice.function.name if isinstance(choice, NamedToolChoice) else None
        return tool_call(tools, tool_format, forced)
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return json_object()
    return json_schema(fmt.json_schema.schema_)
