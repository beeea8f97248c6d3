"""Request bodies of the Anthropic Messages API subset we serve (pydantic; validation errors become 400s).

Unknown fields are ignored so newer clients (Claude Code sends many betas) keep working.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvreuse.runtime.server.core.validation import MAX_STOP, check_object_schema


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class CacheControl(_Body):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] = "5m"

    @property
    def seconds(self) -> float:
        return 3600.0 if self.ttl == "1h" else 300.0


class _Block(_Body):
    cache_control: CacheControl | None = None


class TextBlock(_Block):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock] = ""
    is_error: bool = False

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(b.text for b in self.content)


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # accepted and ignored: a local model has no signatures


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: str = ""


class UnsupportedBlock(_Block):
    """Media we cannot feed a text model: refused with a clear 400 (not a schema error)."""

    type: Literal["image", "document", "search_result", "server_tool_use", "web_search_tool_result"]


Block = TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock | UnsupportedBlock


class Message(_Body):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolDef(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: CacheControl | None = None

    @field_validator("input_schema")
    @classmethod
    def _valid_schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_object_schema(v, "input_schema", "input_schema")


class ToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(_Body):
    """``enabled`` turns the template's reasoning on and caps it at ``budget_tokens`` (Anthropic's
    minimum of 1024 is not imposed: local models are small)."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _budget(self) -> Thinking:
        if self.type == "enabled" and self.budget_tokens is None:
            raise ValueError("thinking of type 'enabled' needs budget_tokens")
        return self


class Metadata(_Body):
    user_id: str | None = Field(default=None, max_length=256)


class _Counted(_Body):
    """The fields that decide the prompt (what ``count_tokens`` takes)."""

    model: str | None = None
    system: str | list[TextBlock] | None = None
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    cache_control: CacheControl | None = None  # automatic: a breakpoint at the end of the prompt

    @model_validator(mode="after")
    def _consistent(self) -> _Counted:
        c = self.tool_choice
        if c is not None and c.type == "tool":
            if not c.name:
                raise ValueError("tool_choice of type 'tool' needs a name")
            if c.name not in {t.name for t in self.tools or []}:
                raise ValueError(f"tool_choice names {c.name!r}, which is not in tools")
        if c is not None and c.type == "any" and not self.tools:
            raise ValueError("tool_choice 'any' needs tools")
        if c is not None and c.type in ("any", "tool") and self.thinking and self.thinking.type == "enabled":
            raise ValueError("thinking may not be enabled when tool_choice forces tool use")
        return self


class CountTokensRequest(_Counted):
    """``POST /v1/messages/count_tokens``."""


class MessagesRequest(_Counted):
    """``POST /v1/messages``."""

    max_tokens: int = Field(ge=1)
    stream: bool = False
    stop_sequences: list[str] | None = Field(default=None, max_length=MAX_STOP)
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=1)
    metadata: Metadata | None = None

    @model_validator(mode="after")
    def _budget_below_max(self) -> MessagesRequest:
        t = self.thinking
        if (
            t is not None
            and t.type == "enabled"
            and t.budget_tokens is not None
            and t.budget_tokens >= self.max_tokens
        ):
            raise ValueError("max_tokens must be greater than thinking.budget_tokens")
        return self
