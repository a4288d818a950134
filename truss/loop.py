"""The agent loop: the provider proposes, the gate disposes, until the run has an answer or must stop.

Each turn: charge the turn against the budget; build a ``TurnRequest`` (system text, the
conversation so far, the mounted tools under provider-safe names); get the response (replayed from
the ledger when the session already recorded this turn, else from the provider); record a
``model_turn`` entry (request and response canonical bytes as blobs, usage, stop reason); run the
proposed calls through the gate, several at once up to ``agent.max_parallel_calls``; append one
tool message per call, in the order the model proposed them, each with a note of what is left of the
budget. The loop stops when the model answers without calls (``done``), a budget or the deadline
refuses the next turn, the provider fails, or a call waits for approval (``suspended``).

Replay: a recorded turn is matched by its number and its *replay key*, the hash of the request
without the budget notes (time left differs between a run and its resumption; everything else
must not). A turn whose recorded response had secret arguments redacted cannot be replayed from
the record (the secret is not there, by design), so the provider is asked again and its redacted
answer must hash to the recorded one. A mismatch is a ``ReplayDivergenceError``; nothing is called.

The loop does no I/O of its own: the provider, the gate (and through it the store and the
transport) are passed in. It never imports the MCP SDK.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from truss import budget as budget_mod
from truss._clock import Clock
from truss._errors import ProviderError, ReplayDivergenceError, TrussError
from truss.budget import BudgetState, Charged, Exceeded
from truss.contract import Contract
from truss.gate import CallOutcome, CallRequest, Gate, ProgressEvent, Redactor
from truss.ledger.canonical import canonical, sha256_ref
from truss.ledger.entry import Record
from truss.providers.base import Provider, ToolCall, ToolSpec, TurnRequest, TurnResponse

__all__ = ["DEFAULT_SYSTEM", "LoopResult", "StopReason", "run_loop"]

_MAX_NAME_CHARS = 200

StopReason = Literal["done", "suspended", "budget", "deadline", "provider_error"]

DEFAULT_SYSTEM = (
    "You are an agent run by Truss. Use the tools offered to do the task; every call is checked "
    "against a policy and a budget, and a refused call comes back as an error result saying why. "
    "Each tool result is followed by what is left of your budget. When the task is done, answer with "
    "a short summary and no tool calls."
)


@dataclass(frozen=True)
class LoopResult:
    stop: StopReason
    turns: int
    final_text: str | None = None
    reason: str | None = None
    limit: str | None = None  # the budget limit that ended the run
    waiting: tuple[str, ...] = ()  # call ids waiting for approval (or a signal)
    waiting_on: str = "approval"  # what they wait for: approval | signal | task
    outcomes: tuple[CallOutcome, ...] = field(default_factory=tuple[CallOutcome, ...])


def _budget_note(left: Mapping[str, Any]) -> str:
    parts = [f"{k}={v}" for k, v in left.items() if not isinstance(v, dict)]
    for key in ("servers", "tools"):
        nested: Any = left.get(key)
        if isinstance(nested, dict):
            parts += [f"{key[:-1]} {name}={n}" for name, n in nested.items()]  # pyright: ignore[reportUnknownVariableType]
    return "[budget left: " + ", ".join(parts) + "]"


class _Conversation:
    """The messages so far; a tool message's budget note is its ``note`` (providers show it after the
    result; step references never see it) and is left out of the replay key."""

    def __init__(self, intent: str) -> None:
        self._messages: list[dict[str, Any]] = [{"role": "user", "text": intent}]
        self._notes: list[str | None] = [None]

    def add(self, message: dict[str, Any], note: str | None = None) -> None:
        self._messages.append(message)
        self._notes.append(note)

    def rendered(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for message, note in zip(self._messages, self._notes, strict=True):
            out.append(dict(message) if note is None else {**message, "note": note})
        return out

    def bare(self) -> list[dict[str, Any]]:
        return [dict(m) for m in self._messages]


async def run_loop(
    *,
    contract: Contract,
    gate: Gate,
    provider: Provider,
    clock: Clock,
    intent: str,
    redactor: Redactor,
    on_progress: Callable[[ProgressEvent], None] | None = None,
) -> LoopResult:
    """Drive the run until it is done, stopped by a limit, failed by the provider, or suspended."""
    tools = sorted(gate.tools.values(), key=lambda t: t.name)
    specs = [ToolSpec(t.provider_name, t.description, dict(t.input_schema)) for t in tools]
    by_provider = {t.provider_name: t.name for t in tools}
    system = contract.agent.system or DEFAULT_SYSTEM
    conversation = _Conversation(intent)
    outcomes: list[CallOutcome] = []
    limiter = anyio.CapacityLimiter(contract.agent.max_parallel_calls)
    turn = 0
    while True:
        turn += 1
        charged = await gate.charge(lambda state: budget_mod.charge_turn(state, contract, clock.now_ms()))
        if isinstance(charged, Exceeded):
            stop: StopReason = "deadline" if charged.limit == "deadline" else "budget"
            return LoopResult(stop, turn - 1, reason=charged.detail, limit=charged.limit, outcomes=tuple(outcomes))
        request = TurnRequest(system=system, messages=conversation.rendered(), tools=specs, turn=turn)
        bare = TurnRequest(system=system, messages=conversation.bare(), tools=specs, turn=turn)
        time_left = budget_mod.time_left_s(contract, gate.budget, clock.now_ms())
        response: TurnResponse | None = None
        try:
            with anyio.move_on_after(time_left):
                response = await _turn(request, bare, provider, gate, redactor, by_provider, contract, on_progress)
        except ProviderError as exc:
            return LoopResult("provider_error", turn, reason=exc.message, outcomes=tuple(outcomes))
        if response is None:
            detail = f"the run's deadline of {contract.budget.deadline} passed while waiting for the model"
            return LoopResult("deadline", turn, reason=detail, limit="deadline", outcomes=tuple(outcomes))
        usage = await gate.charge(functools.partial(_add_usage, contract=contract, response=response))
        if isinstance(usage, Exceeded):
            conversation.add(_assistant(response))
            return LoopResult("budget", turn, reason=usage.detail, limit=usage.limit, outcomes=tuple(outcomes))
        conversation.add(_assistant(response))
        if not response.tool_calls:
            return LoopResult("done", turn, final_text=response.text, outcomes=tuple(outcomes))

        requests = [
            CallRequest(
                call=f"c{turn}.{i}",
                tool=by_provider.get(c.name) or _unknown_name(c.name),
                arguments=c.arguments,
                turn=turn,
                raw_arguments=c.raw_arguments,
                model_call_id=c.id,
            )
            for i, c in enumerate(response.tool_calls)
        ]
        results = await _run_calls(gate, requests, limiter)
        outcomes.extend(results)
        for call, outcome in zip(response.tool_calls, results, strict=True):
            conversation.add(_tool_message(call, outcome), _budget_note(gate.remaining()))
        waiting = tuple(o.call for o in results if o.outcome == "suspended")
        if waiting:
            codes = {o.code for o in results if o.outcome == "suspended"}
            on = "approval" if "approval" in codes else "signal" if "signal" in codes else "task"
            why = {"approval": "waiting for approval", "signal": "waiting for a signal"}.get(on, "waiting for a task")
            return LoopResult("suspended", turn, reason=why, waiting=waiting, waiting_on=on, outcomes=tuple(outcomes))


async def _run_calls(gate: Gate, requests: list[CallRequest], limiter: anyio.CapacityLimiter) -> list[CallOutcome]:
    """Run the calls of one turn concurrently; results in request order; the first error re-raised.

    Errors are collected per call rather than left to the task group, so a caller sees the Truss
    error itself (not an exception group) and the other calls of the turn still finish and are
    recorded.
    """
    results: list[CallOutcome | None] = [None] * len(requests)
    errors: list[BaseException] = []

    async def one(i: int, request: CallRequest) -> None:
        async with limiter:
            try:
                results[i] = await gate.call(request)
            except TrussError as exc:
                errors.append(exc)

    async with anyio.create_task_group() as group:
        for i, request in enumerate(requests):
            group.start_soon(one, i, request)
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


def _add_usage(state: BudgetState, *, contract: Contract, response: TurnResponse) -> Charged | Exceeded:
    return budget_mod.add_usage(state, contract, response.usage.input_tokens, response.usage.output_tokens)


def _unknown_name(name: str) -> str:
    """A name the model made up, as it is recorded: bounded, so a model cannot bloat the ledger."""
    if len(name) <= _MAX_NAME_CHARS:
        return name
    return f"{name[:_MAX_NAME_CHARS]}...({sha256_ref(name.encode('utf-8', 'replace'))})"


def _assistant(response: TurnResponse) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "text": response.text}
    if response.tool_calls:
        message["tool_calls"] = [c.to_json() for c in response.tool_calls]
    return message


def _tool_message(call: ToolCall, outcome: CallOutcome) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "tool",
        "call_id": call.id,
        "name": call.name,
        "is_error": outcome.result.is_error,
        "text": outcome.result.text,
    }
    if outcome.result.structured is not None:
        message["structured"] = outcome.result.structured
    return message


def _redact_calls(
    calls: Any, redactor: Redactor, by_provider: Mapping[str, str], contract: Contract
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for raw in calls if isinstance(calls, list) else []:  # pyright: ignore[reportUnknownVariableType]
        call: dict[str, Any] = dict(raw)  # pyright: ignore[reportUnknownArgumentType]
        tool = by_provider.get(str(call.get("name")))
        args: Any = call.get("arguments")
        if tool is not None and isinstance(args, dict):
            server = tool.split(":")[1]
            if contract.mcp.server(server) is not None:
                call["arguments"] = redactor.redact_arguments(server, args)  # pyright: ignore[reportUnknownArgumentType]
        out.append(call)
    return out


def _recorded_form(
    value: dict[str, Any], redactor: Redactor, by_provider: Mapping[str, str], contract: Contract
) -> Any:
    """A request's or response's JSON as it may be stored: secret arguments redacted, secrets scrubbed."""
    value = dict(value)
    if "tool_calls" in value:
        value["tool_calls"] = _redact_calls(value["tool_calls"], redactor, by_provider, contract)
    if isinstance(value.get("messages"), list):
        messages: list[Any] = []
        for m in value["messages"]:
            message: dict[str, Any] = dict(m)
            if "tool_calls" in message:
                message["tool_calls"] = _redact_calls(message["tool_calls"], redactor, by_provider, contract)
            messages.append(message)
        value["messages"] = messages
    return redactor.scrub(value)


async def _turn(  # noqa: PLR0917 - one private call site
    request: TurnRequest,
    bare: TurnRequest,
    provider: Provider,
    gate: Gate,
    redactor: Redactor,
    by_provider: Mapping[str, str],
    contract: Contract,
    on_progress: Callable[[ProgressEvent], None] | None,
) -> TurnResponse:
    journal = gate.journal
    replay_key = sha256_ref(canonical(_recorded_form(bare.to_json(), redactor, by_provider, contract)))
    recorded = journal.turns.get(request.turn)
    if recorded is not None:
        body: Mapping[str, Any] = recorded.body
        if body.get("replay_key") != replay_key:
            raise ReplayDivergenceError(
                f"resumed session {journal.session} built a different request for model turn {request.turn} "
                "than the one recorded",
                remedy="The run no longer matches its record; nothing was called. Start a new run",
                session=journal.session,
                seq=recorded.seq,
                expected=f"model_turn {request.turn} {body.get('replay_key')}",
                actual=f"model_turn {request.turn} {replay_key}",
            )
        if body.get("redacted") is True:
            response = await provider.next_turn(request)
            stored = _recorded_form(response.to_json(), redactor, by_provider, contract)
            if sha256_ref(canonical(stored)) != body.get("response"):
                raise ReplayDivergenceError(
                    f"resumed session {journal.session}: the model answered turn {request.turn} differently "
                    "than recorded",
                    remedy="The run no longer matches its record; nothing was called. Start a new run",
                    session=journal.session,
                    seq=recorded.seq,
                    expected=f"response {body.get('response')}",
                    actual=f"response {sha256_ref(canonical(stored))}",
                )
        else:
            data = journal.blob(str(body.get("response")))
            if data is None:
                raise ReplayDivergenceError(
                    f"model turn {request.turn} of session {journal.session} was recorded, but its payload was erased",
                    remedy="A session whose payloads were erased cannot be resumed; start a new run",
                    session=journal.session,
                    seq=recorded.seq,
                    expected="response payload",
                    actual="erased",
                )
            response = TurnResponse.from_json(json.loads(data))
            if provider.name == "scripted":
                # The scripted provider is a pure function of the plan and the request: asking it
                # costs nothing and calls nothing, and a different answer means the plan changed
                # since the run was recorded (an edited contract, a different ${env.X}).
                planned = _recorded_form((await provider.next_turn(request)).to_json(), redactor, by_provider, contract)
                if sha256_ref(canonical(planned)) != body.get("response"):
                    raise ReplayDivergenceError(
                        f"resumed session {journal.session}: the plan asks for something else at model turn "
                        f"{request.turn} than the run recorded",
                        remedy="The plan changed since the run (the contract or an ${env.X} it uses); nothing was "
                        "called. Restore it, or start a new run",
                        session=journal.session,
                        seq=recorded.seq,
                        expected=f"model_turn {request.turn} response {body.get('response')}",
                        actual=f"model_turn {request.turn} response {sha256_ref(canonical(planned))}",
                    )
        if on_progress is not None:
            on_progress(
                ProgressEvent(kind="turn", session=journal.session, detail=f"turn {request.turn}", replayed=True)
            )
        return response

    response = await provider.next_turn(request)
    raw_json = response.to_json()
    stored_response = _recorded_form(raw_json, redactor, by_provider, contract)
    stored_request = _recorded_form(request.to_json(), redactor, by_provider, contract)
    request_bytes = canonical(stored_request)
    response_bytes = canonical(stored_response)
    request_ref, response_ref = sha256_ref(request_bytes), sha256_ref(response_bytes)
    body_out: dict[str, Any] = {
        "turn": request.turn,
        "provider": provider.name,
        "request": request_ref,
        "response": response_ref,
        "replay_key": replay_key,
        "usage": {"input_tokens": response.usage.input_tokens, "output_tokens": response.usage.output_tokens},
        "stop_reason": response.stop_reason,
        "tool_calls": len(response.tool_calls),
    }
    if stored_response != raw_json:
        body_out["redacted"] = True
    await journal.append(
        Record("model_turn", body_out, {request_ref: request_bytes, response_ref: response_bytes}), durable=True
    )
    if on_progress is not None:
        on_progress(ProgressEvent(kind="turn", session=journal.session, detail=f"turn {request.turn}"))
    return response
