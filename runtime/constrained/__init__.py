"""Constrained decoding: grammars (JSON schemas, tool calls) turned into per-token masks.

``spec`` builds grammar text (plain data that travels in ``SamplingParams``), ``compiler`` compiles
each grammar once and hands every request its own ``Matcher``, ``masking`` applies the masks and
``logit_bias`` to the rows of a batch that have them.  Backed by llguidance (see docs/constrained.md).
"""

from runtime.constrained.compiler import GrammarCompiler, GrammarError
from runtime.constrained.masking import apply_constraints
from runtime.constrained.matcher import Matcher
from runtime.constrained.spec import CALL_FORMATS, Grammar, json_object, json_schema, tool_call

__all__ = [
    "CALL_FORMATS",
    "Grammar",
    "GrammarCompiler",
    "GrammarError",
    "Matcher",
    "apply_constraints",
    "json_object",
    "json_schema",
    "tool_call",
]
