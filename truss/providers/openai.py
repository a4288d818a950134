"""The OpenAI provider: one ``TurnRequest`` becomes one Chat Completions call.

Wire format (``POST {base_url}/chat/completions``, ``Authorization: Bearer <key>`` when there is a
key): tools go as ``{"type": "function", "function": {name, description, parameters}}``; the
neutral conversation becomes ``system``/``user``/``assistant``/``tool`` messages, the assistant's
calls ``tool_calls`` with JSON-*string* arguments; a request's ``tool_choice`` (the reviewer
panel's form) becomes ``{"type": "function", "function": {"name": ...}}``. The first choice of the answer is read:
``content`` (or ``refusal``), ``tool_calls``, ``finish_reason`` and ``usage``.

Many servers speak this format (Ollama, vLLM, llama.cpp, LM Studio), each a little differently,
so the reading is lenient where it costs nothing and strict where it matters:

- arguments that do not parse as a JSON object become ``ToolCall(arguments=None,
  raw_arguments=...)``: the loop tells the model, the run goes on; empty arguments mean ``{}``
  and an already-decoded object is accepted;
- a call without an id gets ``call-<turn>-<n>`` (deterministic, so replay matches);
- a missing ``usage`` counts as zero tokens; any other shape problem is a ``ProviderError``
  with ``reason="bad_response"``.

The token limit goes as ``max_completion_tokens`` to OpenAI itself and as ``max_tokens`` to any
other ``base_url``, which is the name compatible servers read. Retries, timeouts and size bounds
are ``_http.JsonPoster``'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx2

from truss._clock import Clock
from truss._errors import ProviderError
from truss.contract.providers import OPENAI
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

__all__ = ["DEFAULT_BASE_URL", "OpenAIProvider", "to_wire"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"

_FINISH_REASONS: dict[str, StopReason] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}


class OpenAIProvider:
    """A model behind a Chat Completions endpoint (OpenAI or any compatible server)."""

    name = "openai"
    capabilities = OPENAI.capabilities

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
        self._limit_field = "max_completion_tokens" if base_url is None else "max_tokens"
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = JsonPoster(
            provider=self.name,
            url=(base_url or DEFAULT_BASE_URL).rstrip("/") + "/chat/completions",
            headers=headers,
            secrets=[api_key] if api_key else [],
            settings=settings or HttpSettings(),
            clock=clock,
            sleep=sleep,
            jitter=jitter,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"OpenAIProvider(model={self.model!r}, url={self._http.display_url!r})"

    async def next_turn(self, request: TurnRequest) -> TurnResponse:
        body = to_wire(
            request,
            model=self.model,
            max_output_tokens=self.max_output_tokens,
            temperature=self.temperature,
            limit_field=self._limit_field,
        )
        return self._from_wire(await self._http.post(body), request.turn)

    async def aclose(self) -> None:
        await self._http.aclose()

    def _from_wire(self, data: Any, turn: int) -> TurnResponse:
        answer = as_object(data)
        if answer is None:
            raise self._http.invalid("expected a JSON object")
        if answer.get("error") is not None:
            raise self._http.invalid("an error object came with a success status")
        choices = as_list(answer.get("choices"))
        if not choices:
            raise self._http.invalid("'choices' is missing or empty")
        choice = as_object(choices[0])
        if choice is None:
            raise self._http.invalid("choices[0] is not an object")
        message = as_object(choice.get("message"))
        if message is None:
            raise self._http.invalid("choices[0].message is not an object")
        content = message.get("content")
        refusal = message.get("refusal")
        if content is not None and not isinstance(content, str):
            raise self._http.invalid("choices[0].message.content is not a string")
        text = content or ""
        if not text and isinstance(refusal, str):
            text = refusal
        raw_calls = message.get("tool_calls")
        calls_list = as_list(raw_calls) if raw_calls is not None else []
        if calls_list is None:
            raise self._http.invalid("choices[0].message.tool_calls is not a list")
        tool_call_count(len(calls_list), self._http)
        calls = [self._tool_call(raw, turn, n) for n, raw in enumerate(calls_list)]
        finish = choice.get("finish_reason")
        stop_reason: StopReason = _FINISH_REASONS.get(finish, "other") if isinstance(finish, str) else "other"
        # Some compatible servers say "stop" even when the turn ends in tool calls.
        if calls and stop_reason == "end_turn":
            stop_reason = "tool_use"
        if isinstance(refusal, str) and refusal and not calls:
            stop_reason = "refusal"
        usage = as_object(answer.get("usage")) or {}
        return TurnResponse(
            text=text,
            tool_calls=calls,
            stop_reason=stop_reason,
            usage=Usage(
                input_tokens=token_count(usage.get("prompt_tokens"), "usage.prompt_tokens", self._http),
                output_tokens=token_count(usage.get("completion_tokens"), "usage.completion_tokens", self._http),
            ),
        )

    def _tool_call(self, raw: Any, turn: int, n: int) -> ToolCall:
        call = as_object(raw)
        if call is None:
            raise self._http.invalid(f"tool_calls[{n}] is not an object")
        function = as_object(call.get("function"))
        if function is None:
            raise self._http.invalid(f"tool_calls[{n}].function is not an object")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call-{turn}-{n}"
        elif len(call_id) > 256:
            raise self._http.invalid(f"tool_calls[{n}].id is longer than 256 characters")
        name = function.get("name")
        if not isinstance(name, str) or len(name) > 256:
            raise self._http.invalid(f"tool_calls[{n}].function.name is not a tool name")
        arguments = function.get("arguments")
        if arguments is None:
            return ToolCall(id=call_id, name=name, arguments={})
        decoded = as_arguments(arguments)
        if decoded is not None:
            return ToolCall(id=call_id, name=name, arguments=decoded)
        if not isinstance(arguments, str):
            return ToolCall(id=call_id, name=name, arguments=None, raw_arguments=json.dumps(arguments))
        if not arguments.strip():
            return ToolCall(id=call_id, name=name, arguments={})
        try:
            parsed: Any = json.loads(arguments)
        except (ValueError, RecursionError):
            parsed = None
        parsed_object = as_arguments(parsed)
        if parsed_object is None:
            return ToolCall(id=call_id, name=name, arguments=None, raw_arguments=arguments)
        return ToolCall(id=call_id, name=name, arguments=parsed_object)


def to_wire(
    request: TurnRequest,
    *,
    model: str,
    max_output_tokens: int,
    temperature: float | None = None,
    limit_field: str = "max_completion_tokens",
) -> dict[str, Any]:
    """The Chat Completions body for ``request`` (no headers, so no key)."""
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    messages.extend(_message(m) for m in request.messages)
    body: dict[str, Any] = {"model": model, "messages": messages, limit_field: max_output_tokens}
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
            }
            for t in request.tools
        ]
    if request.tool_choice is not None:
        body["tool_choice"] = {"type": "function", "function": {"name": request.tool_choice}}
    if temperature is not None:
        body["temperature"] = temperature
    return body


def _message(message: dict[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    text = message.get("text")
    if role == "user":
        return {"role": "user", "content": text if isinstance(text, str) else ""}
    if role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": text if isinstance(text, str) and text else None}
        calls: list[dict[str, Any]] = []
        for raw in as_list(message.get("tool_calls")) or []:
            call = as_object(raw) or {}
            # Send back exactly what the model sent, malformed or not, so the conversation is true.
            raw_arguments = call.get("raw_arguments")
            arguments = (
                raw_arguments
                if isinstance(raw_arguments, str)
                else json.dumps(call.get("arguments") or {}, ensure_ascii=False, separators=(",", ":"))
            )
            calls.append(
                {
                    "id": call.get("id"),
                    "type": "function",
                    "function": {"name": call.get("name"), "arguments": arguments},
                }
            )
        if calls:
            out["tool_calls"] = calls
        elif out["content"] is None:
            out["content"] = ""  # an assistant message needs content or calls; never both absent
        return out
    if role == "tool":
        content = _tool_text(message)
        if message.get("is_error") is True:
            # Chat Completions has no error flag on tool messages; the model must still know.
            content = f"ERROR: {content}"
        return {"role": "tool", "tool_call_id": message.get("call_id"), "content": content}
    raise ProviderError(
        f"model provider openai: the conversation holds a message with role {role!r}",
        provider="openai",
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
