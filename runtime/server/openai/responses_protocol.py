"""Request bodies of the OpenAI Responses API (``POST /v1/responses``, ``/v1/responses/input_tokens``).

Strict like ``protocol.py``: unknown fields are ignored, known ones typed strictly, and a known field we
cannot honour (a hosted tool, an image, ``background``) is a 400 that names it.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from kvreuse.runtime.server.core.validation import check_schema
from kvreuse.runtime.server.openai.protocol import _INTEGRAL, NON_TEXT_PARTS, FunctionDef, Int, _Body

MAX_METADATA = 16  # OpenAI's limits: 16 pairs, keys up to 64 characters, values up to 512
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


# Hosted tools run by OpenAI's servers, not by the client: Codex CLI always lists web_search. This server
# runs none, so they are left out of the prompt (the model is never offered them) rather than refused.
HOSTED_TOOLS = ("web_search", "web_search_preview")


def flat_tools(tools: list[Any]) -> list[Any]:
    """``tools`` with each ``namespace`` tool (Codex CLI's group of function tools) replaced by its
    function tools and the hosted tools left out; anything else as it came (validated after)."""
    out: list[Any] = []
    for t in tools:
        kind = t.get("type") if isinstance(t, dict) else None
        if kind == "namespace" and isinstance(t.get("tools"), list):
            out.extend(flat_tools(t["tools"]))
        elif kind not in HOSTED_TOOLS:
            out.append(t)
    return out


class FunctionTool(FunctionDef):
    """A Responses function tool: the chat completions ``function`` object, flat, with its ``type``."""

    type: Literal["function"]


class FunctionChoice(_Body):
    type: Literal["function"]
    name: str


class TextPart(_Body):
    """A text content part; ``refusal`` parts (assistant history) carry their text as ``refusal``."""

    type: Literal["input_text", "output_text", "text", "refusal"]
    text: str | None = None
    refusal: str | None = None

    @model_validator(mode="after")
    def _has_text(self) -> TextPart:
        if (self.refusal if self.type == "refusal" else self.text) is None:
            raise ValueError(f"a {self.type} content part needs its text")
        return self

    def value(self) -> str:
        return (self.refusal if self.type == "refusal" else self.text) or ""


def _text_only(parts: Any) -> Any:
    if isinstance(parts, list):
        for part in parts:
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind in NON_TEXT_PARTS:
                raise ValueError(
                    f"{kind} content parts are not supported: this server's model reads text only"
                )
    return parts


def joined(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(p.value() for p in content)


class MessageItem(_Body):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[TextPart]


class FunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(_Body):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[TextPart]


class ReasoningText(_Body):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(_Body):
    type: Literal["reasoning"]
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None

    def text(self) -> str:
        return "".join(p.text for p in (self.content or self.summary))


Item = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem, Field(discriminator="type")
]


class TextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> TextFormat:
        if self.type == "json_schema":
            if self.schema_ is None:
                raise ValueError("text.format type 'json_schema' needs schema")
            check_schema(self.schema_, "text.format.schema")
        return self


class TextConfig(_Body):
    format: TextFormat | None = None


class Reasoning(_Body):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None


# field -> why a value other than null / false is refused (it would change the answer silently)
_REFUSED = {
    "background": "background responses are not supported: stream, or wait for the response",
    "conversation": "conversations are not supported: use previous_response_id",
    "prompt": "prompt templates are not supported: send input and instructions",
    "max_tool_calls": "max_tool_calls is not supported: parallel_tool_calls false gives at most one call",
    "top_logprobs": "top_logprobs is not supported on the Responses API",
}


class ResponsesRequest(_Body):
    """``POST /v1/responses`` (and the body ``/v1/responses/input_tokens`` counts)."""

    model: str | None = None
    input: str | list[Item]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    max_output_tokens: Annotated[int, Field(ge=1), _INTEGRAL] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: Int | None = Field(default=None, ge=-(2**63), lt=2**63)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    store: bool = True
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(
        default=None, max_length=MAX_METADATA
    )
    truncation: Literal["auto", "disabled"] = "disabled"
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=128)
    user: str | None = Field(default=None, max_length=256)
    prompt_cache_key: str | None = Field(default=None, max_length=256)

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        try:  # metadata, user, format names come back in the response and the stored record
            json.dumps(data, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise ValueError("the body holds a lone surrogate (\\ud800-\\udfff), which is not text") from None
        for name, why in _REFUSED.items():
            if data.get(name) not in (None, False, 0):
                raise ValueError(why)
        tools = data.get("tools")
        if isinstance(tools, list):
            data["tools"] = tools = flat_tools(tools)
        for t in tools if isinstance(tools, list) else []:
            kind = t.get("type") if isinstance(t, dict) else None
            if isinstance(kind, str) and kind != "function":
                raise ValueError(
                    f"tool type {kind!r} is not supported: only function tools run on this server"
                )
        choice = data.get("tool_choice")
        if isinstance(choice, dict) and isinstance(choice.get("type"), str) and choice["type"] != "function":
            raise ValueError(
                f"tool_choice type {choice['type']!r} is not supported: use auto, none, required or a function"
            )
        items = data.get("input")
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict) and "type" not in item and "role" in item:
                item["type"] = "message"  # EasyInputMessage: a message without its type
            kind = item.get("type") if isinstance(item, dict) else None
            if isinstance(kind, str) and kind not in ITEM_TYPES:
                raise ValueError(
                    f"input items of type {kind!r} are not supported (only {', '.join(ITEM_TYPES)})"
                )
            if isinstance(item, dict):  # here, not in the item models: a union would bury the reason
                _text_only(item.get("content"))
                _text_only(item.get("output"))
        return data

    @field_validator("metadata")
    @classmethod
    def _metadata_keys(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is not None and any(len(k) > 64 for k in v):
            raise ValueError("metadata keys are at most 64 characters")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> ResponsesRequest:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        names = {t.name for t in self.tools or []}
        if isinstance(self.tool_choice, FunctionChoice) and self.tool_choice.name not in names:
            raise ValueError(f"tool_choice names {self.tool_choice.name!r}, which is not in tools")
        if self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice 'required' needs tools")
        if isinstance(self.input, list) and not self.input:
            raise ValueError("input must not be empty")
        return self
