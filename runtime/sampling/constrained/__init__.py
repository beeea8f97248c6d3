"""Constrained decoding: grammars (JSON schemas, tool calls) turned into per-token masks.

``spec`` builds grammar text (plain data that travels in ``SamplingParams``), ``compiler`` compiles
each grammar once and hands every request its own ``Matcher``; ``kvreuse.runtime.sampling.masking`` applies
the masks (and ``logit_bias``) to the rows of a batch that have them.  Backed by llguidance; what the
server builds with it: docs/api.md (tool calls, ``response_format``).
"""

from kvreuse.runtime.sampling.constrained.compiler import GrammarBusy, GrammarCompiler, GrammarError
from kvreuse.runtime.sampling.constrained.matcher import Matcher
from kvreuse.runtime.sampling.constrained.spec import (
    CALL_FORMATS,
    Grammar,
    at_most_one_call,
    json_object,
    json_schema,
    tool_call,
)

__all__ = [
    "CALL_FORMATS",
    "Grammar",
    "GrammarBusy",
    "GrammarCompiler",
    "GrammarError",
    "Matcher",
    "at_most_one_call",
    "json_object",
    "json_schema",
    "tool_call",
]
