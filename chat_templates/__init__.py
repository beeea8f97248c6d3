"""Chat templates for kvreuse: transformers-exact rendering with segments, bundled templates
(chatml, qwen3, llama3), streaming output parsers, and a prefix-stability check.

Append-only history: the bundled ``qwen3`` template takes ``keep_reasoning=True`` (default False), which
renders every assistant turn with its reasoning as generated (a ``<think>...</think>`` block before the
content) so multi-turn thinking conversations stay a token prefix of the next request.  Trade-off: the
model sees its earlier reasoning, which Qwen's training did not, and the context grows.  See README.md.
"""

from kvreuse.chat_templates.conversations import Conversation, default_conversations
from kvreuse.chat_templates.parsers import OutputParser, collect, parse_full
from kvreuse.chat_templates.render import (
    BUNDLED_TEMPLATES,
    RenderedPrompt,
    Segment,
    first_divergence,
    load_template,
    locate,
    locate_char,
    render,
    render_text,
)
from kvreuse.chat_templates.template_check import StepReport, check_prefix_stability
from kvreuse.chat_templates.tool_calls import ParsedDelta, ParsedOutput, ToolCall, ToolCallDelta

__all__ = [
    "BUNDLED_TEMPLATES",
    "Conversation",
    "OutputParser",
    "ParsedDelta",
    "ParsedOutput",
    "RenderedPrompt",
    "Segment",
    "StepReport",
    "ToolCall",
    "ToolCallDelta",
    "check_prefix_stability",
    "collect",
    "default_conversations",
    "first_divergence",
    "load_template",
    "locate",
    "locate_char",
    "parse_full",
    "render",
    "render_text",
]
