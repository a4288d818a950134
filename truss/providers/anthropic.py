"""The Anthropic provider: one ``TurnRequest`` becomes one Messages API call.

Wire format (``POST {base_url}/v1/messages``, headers ``x-api-key`` and ``anthropic-version:
2023-06-01``): tools go as ``{name, description, input_schema}``; the neutral conversation becomes
alternating ``user``/``assistant`` messages, the assistant's calls ``tool_use`` blocks and tool
results ``tool_result`` blocks (with ``is_error``) in the next ``user`` message; a request's
``tool_choice`` (the reviewer panel's form) becomes ``{"type": "tool", "name": ...}``. The answer's
``text`` blocks are joined, ``tool_use`` blocks become ``ToolCall``s, ``stop_reason`` is mapped and
``usage`` counts every input token the request cost (plain, cache writes and cache reads).

The answer is untrusted: its shape is checked and anything else is a ``ProviderError`` with
``reason="bad_response"``. A ``tool_use`` whose ``input`` is not an object is passed on as a call
with ``arguments=None`` so the loop can tell the model, as for a malformed OpenAI call.
Retries, timeouts and size bounds are ``_http.JsonPoster``'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx2

from truss._clock import Clock
from truss._errors import ProviderError
from truss.contract.providers import ANTHROPIC
from truss.providers._http import (
    HttpSettings,
    JsonPoster,
    Sleep,
    as_arguments,
    as_list,
    as_object,
    token_count,
    tool_call_count,
)
from truss.providers.base import StopReason, ToolCall, TurnRequest, TurnResponse, Usage

__all__ = ["DEFAULT_BASE_URL", "AnthropicProvider", "to_wire"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"

_STOP_REASONS: dict[str, StopReason] = {
    "end_turn": "end_turn",
    "stop_sequence": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "model_context_window_exceeded": "max_tokens",
    "refusal": "refusal",
}


class AnthropicProvider:
    """A model behind the Anthropic Messages API."""

    name = "anthropic"
    capabilities = ANTHROPIC.capabilities

    def __init__(
        self,
        *,
        model: str,
        api_key: str | None,
        base_url: str | None = None,
        max_output_tokens: int = 4096,
        temperature: float | None = None,
        settings: HttpSettings | None = None,
        clock: Clock,
        sleep: Sleep | None = None,
        jitter: Callable[[], float] | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.model = model
        self.max_output_tokens = max_output_tokens
        self.temperature = temperature
        headers = {"anthropic-version": API_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        self._http = JsonPoster(
            provider=self.name,
            url=(base_url or DEFAULT_BASE_URL).rstrip("/") + "/v1/messages",
            headers=headers,
            secrets=[api_key] if api_key else [],
            settings=settings or HttpSettings(),
            clock=clock,
            sleep=sleep,
            jitter=jitter,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"AnthropicProvider(model={self.model!r}, url={self._http.display_url!r})"

    async def next_turn(self, request: TurnRequest) -> TurnResponse:
        body = to_wire(
            request, model=self.model, max_output_tokens=self.max_output_tokens, temperature=self.temperature
        )
        return self._from_wire(await self._http.post(body))

    async def aclose(self) -> None:
        await self._http.aclose()

    def _from_wire(self, data: Any) -> TurnResponse:
        answer = as_object(data)
        if answer is None:
            raise self._http.invalid("expected a JSON object")
        if answer.get("type") == "error":
            raise self._http.invalid("an error object came with a success status")
        content = as_list(answer.get("content"))
        if content is None:
            raise self._http.invalid("'content' is not a list")
        texts: list[str] = []
        calls: list[ToolCall] = []
        for position, raw in enumerate(content):
            block = as_object(raw)
            if block is None:
                raise self._http.invalid(f"content[{position}] is not an object")
            kind = block.get("type")
            if kind == "text":
                text = block.get("text")
                if not isinstance(text, str):
                    raise self._http.invalid(f"content[{position}].text is not a string")
                texts.append(text)
            elif kind == "tool_use":
                calls.append(self._tool_call(block, position))
            # Other blocks (thinking, server tool results, ...) carry nothing the loop acts on.
        tool_call_count(len(calls), self._http)
        stop = answer.get("stop_reason")
        stop_reason: StopReason = _STOP_REASONS.get(stop, "other") if isinstance(stop, str) else "other"
        if calls and stop_reason == "end_turn":
            stop_reason = "tool_use"
        usage = as_object(answer.get("usage")) or {}
        input_tokens = sum(
            token_count(usage.get(key), f"usage.{key}", self._http)
            for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        )
        output_tokens = token_count(usage.get("output_tokens"), "usage.output_tokens", self._http)
        return TurnResponse(
            text="\n".join(texts),
            tool_calls=calls,
            stop_reason=stop_reason,
            usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens),
        )

    def _tool_call(self, block: dict[str, Any], position: int) -> ToolCall:
        call_id = block.get("id")
        name = block.get("name")
        if not isinstance(call_id, str) or not call_id or len(call_id) > 256:
            raise self._http.invalid(f"content[{position}].id is not a tool-use id")
        if not isinstance(name, str) or len(name) > 256:
            raise self._http.invalid(f"content[{position}].name is not a tool name")
        arguments = as_arguments(block.get("input"))
        if arguments is None:
            raw = json.dumps(block.get("input"), ensure_ascii=False)
            return ToolCall(id=call_id, name=name, arguments=None, raw_arguments=raw)
        return ToolCall(id=call_id, name=name, arguments=arguments)


def to_wire(
    request: TurnRequest, *, model: str, max_output_tokens: int, temperature: float | None = None
) -> dict[str, Any]:
    """The Messages API body for ``request`` (no headers, so no key)."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_output_tokens, "messages": _messages(request)}
    if request.system:
        body["system"] = request.system
    if request.tools:
        tools: list[dict[str, Any]] = []
        for spec in request.tools:
            tool: dict[str, Any] = {"name": spec.name, "input_schema": spec.input_schema}
            if spec.description:
                tool["description"] = spec.description
            tools.append(tool)
        body["tools"] = tools
    if request.tool_choice is not None:
        body["tool_choice"] = {"type": "tool", "name": request.tool_choice}
    if temperature is not None:
        body["temperature"] = temperature
    return body


def _messages(request: TurnRequest) -> list[dict[str, Any]]:
    # The API wants strictly alternating roles and every tool_result of one assistant turn in the
    # user message right after it, so consecutive same-role messages are merged.
    out: list[dict[str, Any]] = []
    for message in request.messages:
        role, blocks = _blocks(message)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return out


def _blocks(message: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    role = message.get("role")
    text = message.get("text")
    if role == "user":
        return "user", [{"type": "text", "text": text}] if isinstance(text, str) and text else []
    if role == "assistant":
        blocks: list[dict[str, Any]] = []
        if isinstance(text, str) and text:
            blocks.append({"type": "text", "text": text})
        for raw in as_list(message.get("tool_calls")) or []:
            call = as_object(raw) or {}
            arguments = as_object(call.get("arguments")) or {}
            blocks.append({"type": "tool_use", "id": call.get("id"), "name": call.get("name"), "input": arguments})
        return "assistant", blocks
    if role == "tool":
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.get("call_id")}
        content = _tool_text(message)
        if content:
            block["content"] = [{"type": "text", "text": content}]
        if message.get("is_error") is True:
            block["is_error"] = True
        return "user", [block]
    raise ProviderError(
        f"model provider anthropic: the conversation holds a message with role {role!r}",
        provider="anthropic",
        reason="bad_request",
        remedy="This is a bug in the caller of the provider; report it",
    )


def _tool_text(message: dict[str, Any]) -> str:
    """The result text (or its structured content as JSON when there is no text), then the note."""
    text = message.get("text")
    structured = message.get("structured")
    if not (isinstance(text, str) and text):
        text = "" if structured is None else json.dumps(structured, ensure_ascii=False, separators=(",", ":"))
    note = message.get("note")
    if isinstance(note, str) and note:
        return f"{text}\n{note}" if text else note
    return text
