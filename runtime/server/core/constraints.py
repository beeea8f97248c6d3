"""The grammar a chat's tool choice imposes: ``"required"`` or a named tool, with a template that has a
tool-call format, gets a tool-call grammar for what follows the forced prefix
(``templates.forced_tool_prefix``), so the call names one of the tools and its arguments validate
against that tool's parameters.  ``"auto"`` stays free generation, parsed afterwards (without parallel calls: free text, or text and then
one call, ``at_most_one_call``); ``parallel_tool_calls`` lets a forced call be followed by more; ``"none"``
keeps the tools in the prompt (so the cached prefix is the same) but parses no calls.
"""

from __future__ import annotations

from typing import Any

from kvreuse.runtime.sampling.constrained import CALL_FORMATS, Grammar, at_most_one_call, tool_call
from kvreuse.runtime.server.core.prompting import ChatInput, forced_tool
from kvreuse.runtime.server.errors import bad_request


def tool_grammar(chat: ChatInput, tool_format: str | None, tokenizer: Any = None) -> Grammar | None:
    forced = forced_tool(chat)
    if tool_format is None:
        return None
    tools = [(t["function"]["name"], t["function"].get("parameters")) for t in chat.tools or []]
    if forced is None:
        free = chat.tool_choice in (None, "auto") and not chat.parallel_tool_calls
        return at_most_one_call(tools, tool_format) if free else None
    if tool_format not in CALL_FORMATS:  # e.g. qwen_xml: arguments as XML parameters, no grammar yet
        raise bad_request(
            f"tool_choice {forced!r} needs a tool-call grammar, which this model's tool format "
            f'({tool_format}) does not have yet; use tool_choice "auto"',
            "tool_choice",
        )
    name_ids = None
    if tool_format == "harmony" and tokenizer is not None:  # the name as the history tokenises it
        name_ids = {name: tokenizer.encode("." + name, add_special_tokens=False) for name, _ in tools}
    forced_name = None if forced == "required" else forced
    return tool_call(tools, tool_format, forced_name, chat.parallel_tool_calls, name_ids)
