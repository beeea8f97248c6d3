"""Request bodies of the OpenAI API subset we serve, as pydantic models (validation errors become 400s).

Unknown fields are ignored, as OpenAI-compatible servers do, so newer clients keep working.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_STOP = 16
MAX_N = 8


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


def _check_schema(node: Any, where: str, depth: int) -> None:
    """The structural rules of JSON Schema that templates and tool parsers rely on."""
    if depth > 32:
        raise ValueError(f"{where}: schema nested too deeply")
    if not isinstance(node, dict):
        raise ValueError(f"{where}: a schema must be an object")
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    if not all(isinstance(k, str) and k in JSON_TYPES for k in kinds):
        raise ValueError(f"{where}.type: {kind!r} is not a JSON Schema type")
    props = node.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            raise ValueError(f"{where}.properties must be an object")
        for name, sub in props.items():
            _check_schema(sub, f"{where}.properties.{name}", depth + 1)
    req = node.get("required")
    if req is not None and not (isinstance(req, list) and all(isinstance(r, str) for r in req)):
        raise ValueError(f"{where}.required must be a list of property names")
    if "items" in node and not isinstance(node["items"], bool):
        _check_schema(node["items"], f"{where}.items", depth + 1)
    enum = node.get("enum")
    if enum is not None and not isinstance(enum, list):
        raise ValueError(f"{where}.enum must be a list")


class FunctionDef(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _valid_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            if v.get("type", "object") != "object":
                raise ValueError("function parameters must be a JSON Schema of type 'object'")
            _check_schema(v, "parameters", 0)
        return v


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


class ContentPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

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


class _Sampling(_Body):
    model: str | None = None
    user: str | None = Field(default=None, max_length=256)  # names the session (kept cached, pinned)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(default=None, max_length=64)
    ignore_eos: bool = False
    n: int = Field(default=1, ge=1, le=MAX_N)

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

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = None

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
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: one prompt, as text or token ids."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> str | list[int]:
        if isinstance(v, list) and v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError("batched prompts are not supported: send one prompt per request")
            v = v[0]
        if isinstance(v, (str, list)) and len(v) == 0:
            raise ValueError("the prompt is empty")
        return v
