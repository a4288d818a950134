"""The provider interface: one model turn in, one model turn out, in a provider-neutral form.

The loop builds a ``TurnRequest`` (system text, the conversation so far, the mounted tools) and
asks a provider for the next ``TurnResponse`` (text, tool calls, stop reason, usage). Both have a
JSON form (``to_json``) whose canonical bytes are hashed into ``model_turn`` entries, and on
resume a recorded response is rebuilt with ``TurnResponse.from_json`` instead of asking again.

Messages are plain JSON objects:

- ``{"role": "user", "text": "..."}``
- ``{"role": "assistant", "text": "...", "tool_calls": [{"id", "name", "arguments"}]}``
- ``{"role": "tool", "call_id": "...", "name": "...", "is_error": bool, "text": "...",
  "structured": <json or absent>, "note": "..." (optional)}``

A tool message's ``note`` is text the model should read after the result but that is not part of
it (what is left of the budget): the anthropic and openai providers append it to the result text
they send; the scripted provider ignores it, so ``${steps.N.result}`` is the tool's text alone.

``name`` is always the provider-safe name (``mcp__server__tool``); the loop maps it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from truss.contract.providers import ProviderCapabilities

__all__ = ["Provider", "ProviderCapabilities", "ToolCall", "ToolSpec", "TurnRequest", "TurnResponse", "Usage"]

StopReason = Literal["end_turn", "tool_use", "max_tokens", "refusal", "other"]


@dataclass(frozen=True)
class ToolSpec:
    """A tool as shown to a model."""

    name: str  # provider-safe
    description: str
    input_schema: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}


@dataclass(frozen=True)
class ToolCall:
    """A call a model proposed. ``arguments`` is None when the model's JSON did not parse;
    ``raw_arguments`` keeps what it sent so the error shown back to it can quote it."""

    id: str
    name: str
    arguments: dict[str, Any] | None
    raw_arguments: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "name": self.name, "arguments": self.arguments}
        if self.raw_arguments is not None:
            out["raw_arguments"] = self.raw_arguments
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolCall:
        return cls(
            id=data["id"], name=data["name"], arguments=data.get("arguments"), raw_arguments=data.get("raw_arguments")
        )


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class TurnRequest:
    """One turn's request. ``tool_choice`` names a tool the model must call (the reviewer panel's
    form); None leaves the choice to the model, as the agent loop does. ``first``: the position in
    the conversation of ``messages[0]``: 0 when the request holds the whole conversation, more when
    it holds only what was added since the turn before (``ProviderCapabilities.reads_new_messages``)."""

    system: str
    messages: list[dict[str, Any]]
    tools: list[ToolSpec]
    turn: int  # 1-based
    tool_choice: str | None = None
    first: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "system": self.system,
            "messages": self.messages,
            "tools": [t.to_json() for t in self.tools],
            "turn": self.turn,
        }
        if self.tool_choice is not None:
            out["tool_choice"] = self.tool_choice
        if self.first:
            out["first"] = self.first
        return out


@dataclass(frozen=True)
class TurnResponse:
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list[ToolCall])
    stop_reason: StopReason = "end_turn"
    usage: Usage = field(default_factory=Usage)

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "tool_calls": [c.to_json() for c in self.tool_calls],
            "stop_reason": self.stop_reason,
            "usage": {"input_tokens": self.usage.input_tokens, "output_tokens": self.usage.output_tokens},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TurnResponse:
        usage: dict[str, Any] = data.get("usage") or {}
        return cls(
            text=data.get("text", ""),
            tool_calls=[ToolCall.from_json(c) for c in data.get("tool_calls", [])],
            stop_reason=data.get("stop_reason", "other"),
            usage=Usage(int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))),
        )


class Provider(Protocol):
    """A model. Real providers retry 429/5xx themselves and raise ``ProviderError`` when they give up.

    ``name`` is recorded in every ``model_turn``; ``capabilities`` is what the loop asks instead of
    the name (whether the provider plays a fixed plan, so a recorded turn may be checked by asking
    it again).
    """

    name: str

    @property
    def capabilities(self) -> ProviderCapabilities: ...

    async def next_turn(self, request: TurnRequest) -> TurnResponse: ...

    async def aclose(self) -> None: ...
