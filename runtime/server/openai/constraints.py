"""The grammar an OpenAI chat request's output must follow: its tool choice (the core's
``tool_grammar``), else its ``response_format``."""

from __future__ import annotations

from kvreuse.runtime.sampling.constrained import Grammar, json_object, json_schema
from kvreuse.runtime.server.openai.protocol import ChatCompletionRequest


def response_grammar(req: ChatCompletionRequest) -> Grammar | None:
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return json_object()
    return json_schema(fmt.json_schema.schema_)
