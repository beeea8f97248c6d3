"""Request bodies of the OpenAI API subset we serve, as pydantic models (validation errors become 400s).

Unknown fields are ignored, as OpenAI-compatible servers do, so newer clients keep working.  Known
fields are strict, as in the OpenAI API: ``"2"`` is not a number, ``"yes"`` is not a boolean and
``true`` is not a token id (pydantic's lax mode would accept all three).
The few
known fields whose silent ignoring would change the answer are refused (``runtime/server/openai/unsupported.py``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from kvreuse.runtime.server.core.validation import MAX_STOP, check_object_schema, check_schema
from kvreuse.runtime.server.openai.logit_bias import check_logit_bias
from kvreuse.runtime.server.openai.unsupported import refuse_unsupported

MAX_N = 8
MAX_PROMPTS = 32  # batched /v1/completions prompts per request


def _integral(v: Any) -> Any:
    # JSON Schema's "integer" includes 2.0; strict mode would refuse it. Booleans and strings stay refused.
    return int(v) if isinstance(v, float) and v.is_integer() else v


_INTEGRAL = BeforeValidator(_integral)  # after a Field's bounds, so the schema keeps them as minimum/maximum
Int = Annotated[int, _INTEGRAL]
_Text = Annotated[str, Field(min_length=1)]
TokenId = Annotated[int, Field(ge=0), _INTEGRAL]  # the upper bound (vocab size) is the engine's check
_Ids = Annotated[list[TokenId], Field(min_length=1)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class FunctionDef(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _valid_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return v if v is None else check_object_schema(v, "parameters", "function parameters")


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class CalledFunction(_Body):
    name: str = Field(min_length=1)
    arguments: str


class ToolCall(_Body):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: CalledFunction


# content part types of a multimodal OpenAI request (chat completions and Responses)
NON_TEXT_PARTS = frozenset({"image_url", "input_image", "input_audio", "file", "input_file", "audio"})


class ContentPart(_Body):
    type: Literal["text"]
    text: str


# The per-role rules of _role_fields below, in the schema too (JSON Schema if/then).
_ROLE_RULES = [
    {"if": {"properties": {"role": {"const": r}}}, "then": {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}}}
    for r in ("system", "developer", "user", "tool")
] + [{"if": {"properties": {"role": {"const": "tool"}}}, "then": {"required": ["tool_call_id"]}}]  # fmt: skip


class ChatMessage(_Body):
    model_config = ConfigDict(json_schema_extra={"allOf": _ROLE_RULES})

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    # the same, as other clients send it (gpt-oss's template reads ``thinking``; OpenRouter's ``reasoning``)
    thinking: str | None = None
    reasoning: str | None = None

    def reasoning_text(self) -> str | None:
        """An assistant message's reasoning, under whichever of its three names the client used."""
        return next(
            (r for r in (self.reasoning_content, self.thinking, self.reasoning) if r is not None), None
        )

    @model_validator(mode="before")
    @classmethod
    def _text_parts_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("content"), list):
            for part in data["content"]:
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind in NON_TEXT_PARTS:
                    raise ValueError(
                        f"{kind} content parts are not supported: this server's model reads text only"
                    )
        return data

    @model_validator(mode="after")
    def _role_fields(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.role != "assistant" and self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        if self.role != "assistant" and self.tool_calls:
            raise ValueError("only assistant messages may carry tool_calls")
        return self

    def text(self) -> str | None:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content


class StreamOptions(_Body):
    include_usage: bool = False


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Body):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = Field(default="response", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _valid_schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_schema(v, "response_format.json_schema.schema")
        return v


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format type 'json_schema' needs json_schema")
        return self


class _Sampling(_Body):
    model: str | None = None
    user: str | None = Field(default=None, max_length=256)  # names the session (kept cached, pinned)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    # -1 (off) or >= 1; the schema says so too ("not 0"), so it matches what validation does
    top_k: Annotated[int, Field(ge=-1), _INTEGRAL] | None = Field(
        default=None, json_schema_extra={"not": {"const": 0}}
    )
    seed: Int | None = None  # a 64-bit signed integer (checked below with a one-line message)
    stop: str | list[str] | None = None
    stop_token_ids: list[Int] | None = Field(default=None, max_length=64)
    ignore_eos: bool = False
    n: Int = Field(default=1, ge=1, le=MAX_N)
    logit_bias: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: Any) -> Any:
        return refuse_unsupported(data)

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> Any:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return check_logit_bias(v)

    @field_validator("seed")
    @classmethod
    def _seed_range(cls, v: int | None) -> int | None:
        if v is not None and not -(2**63) <= v < 2**63:
            raise ValueError("seed must be a 64-bit signed integer")
        return v

    @field_validator("stop")
    @classmethod
    def _stop_count(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences")
        return v

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int | None) -> int | None:
        if v == 0:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return v


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    # _consistent's top_logprobs rule, in the schema too
    model_config = ConfigDict(
        json_schema_extra={
            "if": {
                "properties": {"top_logprobs": {"type": "integer", "minimum": 1}},
                "required": ["top_logprobs"],
            },
            "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]},
        }
    )

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: Annotated[int, Field(ge=1), _INTEGRAL] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1), _INTEGRAL] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20), _INTEGRAL] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: ResponseFormat | None = None
    # gpt-oss: low / medium / high, into its system message (other values a 400 there); other models ignore it
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        if isinstance(self.tool_choice, NamedToolChoice):
            names = {t.function.name for t in self.tools or []}
            if self.tool_choice.function.name not in names:
                raise ValueError(
                    f"tool_choice names {self.tool_choice.function.name!r}, which is not in tools"
                )
        if self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice 'required' needs tools")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: a prompt as text or token ids, or a list of them (each its own choices)."""

    # one prompt (text or token ids) or a batch of them, each with its own n choices
    prompt: (
        _Text
        | _Ids
        | Annotated[list[_Text], Field(min_length=1, max_length=MAX_PROMPTS)]
        | Annotated[list[_Ids], Field(min_length=1, max_length=MAX_PROMPTS)]
    )
    max_tokens: Int = Field(default=16, ge=1)
    logprobs: Annotated[int, Field(ge=0, le=20), _INTEGRAL] | None = None
    echo: bool = False

    @field_validator("prompt", mode="before")
    @classmethod
    def _plain_errors(cls, v: Any) -> Any:
        # the mistakes worth a sentence of their own, before the union's type errors
        batch = v if isinstance(v, list) and v and isinstance(v[0], (str, list)) else [v]
        if isinstance(v, list) and len(batch) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts per request")
        if v == "" or v == [] or any(p == "" or p == [] for p in batch):
            raise ValueError("the prompt is empty")
        for ids in batch:
            if isinstance(ids, list) and any(type(t) in (int, float) and t < 0 for t in ids):
                raise ValueError("prompt token ids must be >= 0")
        return v

    def prompts(self) -> list[str | list[int]]:
        """The prompts in order: one for a single prompt, several for a batch."""
        p = self.prompt
        return list(p) if isinstance(p, list) and p and isinstance(p[0], (str, list)) else [p]
