"""The agent loop: the provider proposes, the gate disposes, until the run has an answer or must stop.

Each turn: charge the turn against the budget; build a ``TurnRequest`` (system text, the
conversation so far, or only the messages added since the turn before for a provider that reads
only what is new, the mounted tools under provider-safe names); get the response (replayed from
the ledger when the session already recorded this turn, else from the provider); record a
``model_turn`` entry (usage, stop reason, and as blobs the response's canonical bytes and the
request as a *delta*: the messages added since the turn before, chained by hash to that turn's
request, so recording stays linear in the length of the run; ``truss.turns``); run the
proposed calls through the gate, several at once up to ``agent.max_parallel_calls``; append one
tool message per call, in the order the model proposed them, each with a note of what is left of the
budget. The loop stops when the model answers without calls (``done``), a budget or the deadline
refuses the next turn, the provider fails, or a call waits for approval (``suspended``).

When the contract has a ``panel`` check the model is asked to cite, for each claim of its final
answer, the ids of the calls that support it (``CITATION_SYSTEM`` is added to the system text), and
each tool result's note starts with the call's id (``[call c2.0]``) so it knows what to cite.

Replay: a recorded turn is matched by its number and its *replay key*, the same hash chain over
the request without the budget notes (time left differs between a run and its resumption;
everything else must not), so the first turn whose conversation differs is the one reported. A
replayed turn's messages then carry the notes it recorded, so later requests rebuild exactly. A
turn whose recorded response had secret arguments redacted cannot be replayed from the record (the
secret is not there, by design), so the provider is asked again and its redacted answer must hash
to the recorded one. A mismatch is a ``ReplayDivergenceError``; nothing is called.

The loop does no I/O of its own: the provider, the gate (and through it the store and the
transport) are passed in. It never imports the MCP SDK.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import anyio

from truss import budget as budget_mod
from truss._clock import Clock
from truss._errors import ProviderError, ReplayDivergenceError, TrussError
from truss._json import loads
from truss.budget import BudgetState, Charged, Exceeded
from truss.calls import CallOutcome, CallRequest
from truss.contract import Contract, uses_panel
from truss.events import RunEvents
from truss.gate import Gate
from truss.ledger.canonical import canonical, plain_canonical, sha256_ref
from truss.ledger.entry import Record
from truss.providers.base import Provider, ToolCall, ToolSpec, TurnRequest, TurnResponse
from truss.redaction import Redactor
from truss.tools import namespaced, provider_name
from truss.turns import delta

__all__ = ["CITATION_SYSTEM", "DEFAULT_SYSTEM", "LoopResult", "StopReason", "run_loop"]

_MAX_NAME_CHARS = 200

StopReason = Literal["done", "suspended", "budget", "deadline", "provider_error"]

DEFAULT_SYSTEM = (
    "You are an agent run by Truss. Use the tools offered to do the task; every call is checked "
    "against a policy and a budget, and a refused call comes back as an error result saying why. "
    "Each tool result is followed by what is left of your budget. When the task is done, answer with "
    "a short summary and no tool calls."
)

CITATION_SYSTEM = (
    "Your final answer is checked by a panel of reviewers against the recorded results of the calls it "
    "cites. After each claim, cite the calls whose results support it: their ids in square brackets, "
    "e.g. 'The branch is main [c1.0].' or '... [c1.0, c2.1]'. Each tool result is followed by its call "
    "id ('[call c1.0]'). Cite only calls whose results support the claim; citing a call that does not "
    "exist, was refused or returned an error fails the check."
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
    calls: int = 0  # the calls this leg of the run made (live or replayed); their outcomes are on the record


def _budget_note(left: Mapping[str, Any]) -> str:
    parts = [f"{k}={v}" for k, v in left.items() if not isinstance(v, dict)]
    for key in ("servers", "tools"):
        nested: Any = left.get(key)
        if isinstance(nested, dict):
            parts += [f"{key[:-1]} {name}={n}" for name, n in cast(dict[str, Any], nested).items()]
    return "[budget left: " + ", ".join(parts) + "]"


class _Conversation:
    """The messages so far, each held once in the form providers see: a tool message's budget note
    is its ``note`` member (providers show it after the result; step references never see it) and
    is left out of the replay key. ``sent`` counts the messages an earlier turn's request already
    held: the rest are the next turn's ``append``.

    With ``keep`` False (a provider that reads only what is new: ``reads_new_messages``) the
    messages an earlier request held are dropped once it was answered, so a long run holds only the
    current turn's; otherwise every provider request carries the whole conversation."""

    def __init__(self, intent: str, *, keep: bool = True) -> None:
        self._messages: list[dict[str, Any]] = [{"role": "user", "text": intent}]
        self._start = 0  # the position in the conversation of _messages[0]
        self._keep = keep
        self.sent = 0

    def add(self, message: dict[str, Any], note: str | None = None) -> None:
        self._messages.append(message if note is None else {**message, "note": note})

    def __len__(self) -> int:
        return self._start + len(self._messages)

    def request(self) -> tuple[int, list[dict[str, Any]]]:
        """Where the messages of the next request start, and the messages."""
        return self._start, list(self._messages)

    def pending(self) -> list[tuple[dict[str, Any], str | None]]:
        """The messages (bare) and notes added since the last turn's request."""
        out: list[tuple[dict[str, Any], str | None]] = []
        for message in self._messages[self.sent - self._start :]:
            if "note" in message:
                out.append(({k: v for k, v in message.items() if k != "note"}, message["note"]))
            else:
                out.append((message, None))
        return out

    def adopt_notes(self, notes: list[str | None]) -> None:
        """Show the pending messages with the notes a recorded turn gave them, so a resumed run's
        requests are the recorded ones (time left differs between a run and its resumption)."""
        for offset, note in enumerate(notes):
            i = self.sent - self._start + offset
            message = {k: v for k, v in self._messages[i].items() if k != "note"}
            self._messages[i] = message if note is None else {**message, "note": note}

    def mark_sent(self) -> None:
        """The pending messages went out with a turn's request (recorded or answered)."""
        self.sent = len(self)
        if not self._keep:
            self._start, self._messages = self.sent, []


@dataclass
class _Chain:
    """Where this leg of the run is on the request and replay-key chains (``truss.turns``)."""

    tools: str  # ref of the tool list as recorded
    tools_bytes: bytes
    request: str | None = None  # the previous turn's request ref, as recorded
    key: str | None = None  # the previous turn's replay key
    system: str | None = None  # the system text as of the previous turn
    tools_stored: bool = False  # this leg already passed the tool list's bytes to the store


async def run_loop(
    *,
    contract: Contract,
    gate: Gate,
    provider: Provider,
    clock: Clock,
    intent: str,
    redactor: Redactor,
    events: RunEvents | None = None,
) -> LoopResult:
    """Drive the run until it is done, stopped by a limit, failed by the provider, or suspended.

    Each turn is a span of ``events`` (``TurnStarted`` .. ``TurnEnded``) around the model's answer
    and the calls it proposed; the gate's call spans are its children.
    """
    tools = sorted(gate.tools.values(), key=lambda t: t.name)
    specs = [ToolSpec(t.provider_name, t.description, dict(t.input_schema)) for t in tools]
    cites = uses_panel(contract.done.checks)
    system = contract.agent.system or DEFAULT_SYSTEM
    run = _Loop(
        contract=contract,
        gate=gate,
        provider=provider,
        clock=clock,
        redactor=redactor,
        events=events if events is not None and events.active else None,
        specs=specs,
        by_provider={t.provider_name: t.name for t in tools},
        system=f"{system}\n\n{CITATION_SYSTEM}" if cites else system,
        conversation=_Conversation(intent, keep=not _reads_new_messages(provider)),
        chain=_chain(redactor, specs),
        limiter=anyio.CapacityLimiter(contract.agent.max_parallel_calls),
        cites=cites,
    )
    turn = 0
    while True:
        turn += 1
        charged = await gate.charge(lambda state: budget_mod.charge_turn(state, contract, gate.budget_now_ms()))
        if isinstance(charged, Exceeded):
            stop: StopReason = "deadline" if charged.limit == "deadline" else "budget"
            return LoopResult(stop, turn - 1, reason=charged.detail, limit=charged.limit, calls=run.calls)
        if run.events is None:
            result = await run.turn(turn)
        else:
            run.events.turn_started(turn)
            calls = run.calls
            try:
                result = await run.turn(turn)
            except BaseException:
                run.events.turn_ended(turn, "error", run.calls - calls)
                raise
            run.events.turn_ended(turn, result.stop if result is not None else "ok", run.calls - calls)
        if result is not None:
            return result


def _reads_new_messages(provider: Provider) -> bool:
    # Only a provider asked every turn, replayed ones too, may be sent only what is new.
    capabilities = provider.capabilities
    return capabilities.reads_new_messages and capabilities.plays_plan


def _chain(redactor: Redactor, specs: list[ToolSpec]) -> _Chain:
    tools_bytes = canonical(redactor.scrub([spec.to_json() for spec in specs]))
    return _Chain(tools=sha256_ref(tools_bytes), tools_bytes=tools_bytes)


@dataclass
class _Loop:
    """One run of the loop: what every turn shares."""

    contract: Contract
    gate: Gate
    provider: Provider
    clock: Clock
    redactor: Redactor
    events: RunEvents | None
    specs: list[ToolSpec]
    by_provider: dict[str, str]
    system: str
    conversation: _Conversation
    chain: _Chain
    limiter: anyio.CapacityLimiter
    calls: int = 0
    cites: bool = False  # a panel will read the answer's citations: notes name each call's id

    async def turn(self, turn: int) -> LoopResult | None:
        """One turn (already charged): the model's answer, then its calls. None: the run goes on."""
        contract, gate, calls = self.contract, self.gate, self.calls
        response: TurnResponse | None = None
        answer = _turn(
            _Turn(turn, self.system, self.specs, self.conversation, self.chain), self.provider, gate,
            self.redactor, self.by_provider, contract, self.events,
        )  # fmt: skip
        try:
            if turn in gate.journal.turns and self.provider.capabilities.plays_plan:
                # A recorded turn of a provider that plays a plan waits for nothing (its answer is a
                # pure function of the plan and the request; the record is read in memory), so no
                # deadline can pass inside it, and the turn's charge just checked the deadline.
                response = await answer
            else:
                with anyio.move_on_after(budget_mod.time_left_s(contract, gate.budget, gate.budget_now_ms())):
                    response = await answer
        except ProviderError as exc:
            return LoopResult("provider_error", turn, reason=exc.message, calls=calls)
        if response is None:
            detail = f"the run's deadline of {contract.budget.deadline} passed while waiting for the model"
            return LoopResult("deadline", turn, reason=detail, limit="deadline", calls=calls)
        usage = await gate.charge(functools.partial(_add_usage, contract=contract, response=response))
        if isinstance(usage, Exceeded):
            self.conversation.add(_assistant(response))
            return LoopResult("budget", turn, reason=usage.detail, limit=usage.limit, calls=calls)
        self.conversation.add(_assistant(response))
        if not response.tool_calls:
            return LoopResult("done", turn, final_text=response.text, calls=calls)

        requests = [
            CallRequest(
                call=f"c{turn}.{i}",
                tool=self.by_provider.get(c.name) or _requested_name(c.name, self.contract),
                arguments=c.arguments,
                turn=turn,
                raw_arguments=c.raw_arguments,
                model_call_id=c.id,
            )
            for i, c in enumerate(response.tool_calls)
        ]
        results = await _run_calls(gate, requests, self.limiter)
        self.calls = calls = calls + len(results)
        for call, outcome in zip(response.tool_calls, results, strict=True):
            note = _budget_note(gate.remaining())
            self.conversation.add(_tool_message(call, outcome), f"[call {outcome.call}] {note}" if self.cites else note)
        waiting = tuple(o.call for o in results if o.outcome == "suspended")
        if waiting:
            codes = {o.code for o in results if o.outcome == "suspended"}
            on = "approval" if "approval" in codes else "signal" if "signal" in codes else "task"
            why = {"approval": "waiting for approval", "signal": "waiting for a signal"}.get(on, "waiting for a task")
            return LoopResult("suspended", turn, reason=why, waiting=waiting, waiting_on=on, calls=calls)
        return None


async def _run_calls(gate: Gate, requests: list[CallRequest], limiter: anyio.CapacityLimiter) -> list[CallOutcome]:
    """Run the calls of one turn concurrently; results in request order; the first error re-raised.

    Errors are collected per call rather than left to the task group, so a caller sees the Truss
    error itself (not an exception group) and the other calls of the turn still finish and are
    recorded.
    """
    if len(requests) == 1:
        # One call (every replayed turn of a scripted run, most live ones): nothing runs beside it,
        # so it needs neither a task group nor a slot of the limiter; a Truss error is raised as is,
        # as below, and the call is recorded the same way.
        return [await gate.call(requests[0])]
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


def _requested_name(name: str, contract: Contract) -> str:
    """The name an unmounted call is recorded under: ``mcp:<server>:<tool>`` when ``name`` is exactly
    the provider name of a tool of one of the contract's servers (a tool the server does not
    advertise, or one Truss refused to mount), so the denial is found under the name the rest of the
    record uses; otherwise the name as the model sent it, bounded."""
    for server in contract.mcp.servers:
        prefix = f"mcp__{server.name}__"
        tool = name[len(prefix) :] if name.startswith(prefix) else ""
        if tool and provider_name(server.name, tool) == name:
            return namespaced(server.name, tool)
    return _unknown_name(name)


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
    for raw in cast(list[Any], calls) if isinstance(calls, list) else []:
        call: dict[str, Any] = dict(cast(Mapping[str, Any], raw))
        tool = by_provider.get(str(call.get("name")))
        args: Any = call.get("arguments")
        if tool is not None and isinstance(args, dict):
            server = tool.split(":")[1]
            if contract.mcp.server(server) is not None:
                call["arguments"] = redactor.redact_arguments(server, cast(dict[str, Any], args))
        out.append(call)
    return out


def _recorded_form(
    value: dict[str, Any], redactor: Redactor, by_provider: Mapping[str, str], contract: Contract
) -> Any:
    """A message's or response's JSON as it may be stored: secret arguments redacted, secrets scrubbed."""
    value = dict(value)
    if "tool_calls" in value:
        value["tool_calls"] = _redact_calls(value["tool_calls"], redactor, by_provider, contract)
    return redactor.scrub(value)


@dataclass(frozen=True)
class _Turn:
    number: int
    system: str
    specs: list[ToolSpec]
    conversation: _Conversation
    chain: _Chain

    def request(self) -> TurnRequest:
        first, messages = self.conversation.request()
        return TurnRequest(system=self.system, messages=messages, tools=self.specs, turn=self.number, first=first)

    def link(self, prev: str | None, append: list[Any]) -> bytes:
        system = self.system if self.system != self.chain.system else None
        return canonical(delta(turn=self.number, prev=prev, system=system, tools=self.chain.tools, append=append))

    def advance(self, request_ref: str, key: str) -> None:
        self.chain.request, self.chain.key, self.chain.system = request_ref, key, self.system
        self.conversation.mark_sent()


def _recorded_notes(data: bytes | None, count: int) -> list[str | None] | None:
    """The notes a recorded request delta gave its appended messages, when it holds ``count`` of them."""
    try:
        link: Any = loads(data) if data is not None else None
    except ValueError:
        return None
    append: Any = cast(dict[str, Any], link).get("append") if isinstance(link, dict) else None
    if not isinstance(append, list) or len(cast(list[Any], append)) != count:
        return None
    notes: list[str | None] = []
    for message in cast(list[Any], append):
        note: Any = cast(dict[str, Any], message).get("note") if isinstance(message, dict) else None
        notes.append(note if isinstance(note, str) else None)
    return notes


async def _turn(  # noqa: PLR0917 - one private call site
    turn: _Turn,
    provider: Provider,
    gate: Gate,
    redactor: Redactor,
    by_provider: Mapping[str, str],
    contract: Contract,
    events: RunEvents | None,
) -> TurnResponse:
    journal = gate.journal
    pending = turn.conversation.pending()
    bare = [_recorded_form(message, redactor, by_provider, contract) for message, _ in pending]
    replay_key = sha256_ref(turn.link(turn.chain.key, bare))
    recorded = journal.replayed_turn(turn.number)  # replayed once: not kept for the rest of the run
    if recorded is not None:
        body: Mapping[str, Any] = recorded.body
        if body.get("replay_key") != replay_key:
            raise ReplayDivergenceError(
                f"resumed session {journal.session} built a different request for model turn {turn.number} "
                "than the one recorded",
                remedy="The run no longer matches its record; nothing was called. Start a new run",
                session=journal.session,
                seq=recorded.seq,
                expected=f"model_turn {turn.number} {body.get('replay_key')}",
                actual=f"model_turn {turn.number} {replay_key}",
            )
        recorded_request = str(body.get("request"))
        notes = _recorded_notes(journal.blob(recorded_request), len(pending))
        if notes is not None:
            turn.conversation.adopt_notes(notes)
        request = turn.request()
        if body.get("redacted") is True:
            response = await provider.next_turn(request)
            stored = _recorded_form(response.to_json(), redactor, by_provider, contract)
            if sha256_ref(canonical(stored)) != body.get("response"):
                raise ReplayDivergenceError(
                    f"resumed session {journal.session}: the model answered turn {turn.number} differently "
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
                    f"model turn {turn.number} of session {journal.session} was recorded, but its payload was erased",
                    remedy="A session whose payloads were erased cannot be resumed; start a new run",
                    session=journal.session,
                    seq=recorded.seq,
                    expected="response payload",
                    actual="erased",
                )
            if not provider.capabilities.plays_plan:
                response = TurnResponse.from_json(json.loads(data))
            else:
                # A provider that plays a plan is a pure function of the plan and the request: asking
                # it costs nothing and calls nothing, and a different answer means the plan changed
                # since the run was recorded (an edited contract, a different ${env.X}).
                answer = await provider.next_turn(request)
                answer_json = answer.to_json()
                planned = _recorded_form(answer_json, redactor, by_provider, contract)
                plain = plain_canonical(planned)
                if sha256_ref(plain if plain is not None else canonical(planned)) != body.get("response"):
                    raise ReplayDivergenceError(
                        f"resumed session {journal.session}: the plan asks for something else at model turn "
                        f"{turn.number} than the run recorded",
                        remedy="The plan changed since the run (the contract or an ${env.X} it uses); nothing was "
                        "called. Restore it, or start a new run",
                        session=journal.session,
                        seq=recorded.seq,
                        expected=f"model_turn {turn.number} response {body.get('response')}",
                        actual=f"model_turn {turn.number} response {sha256_ref(canonical(planned))}",
                    )
                # The recorded bytes hash to the same ref (R5), so they are ``planned``'s canonical
                # form: when nothing was redacted and the answer is plain JSON (no float, whose type
                # a round trip could change), decoding them gives this very answer again.
                if plain is not None and planned == answer_json:
                    response = answer
                else:
                    response = TurnResponse.from_json(json.loads(data))
        turn.advance(recorded_request, replay_key)
        if events is not None:
            events.model_answered(turn.number, recorded, replayed=True)
        return response

    response = await provider.next_turn(turn.request())
    raw_json = response.to_json()
    stored_response = _recorded_form(raw_json, redactor, by_provider, contract)
    # Redacting the response may have taught the redactor a secret: the appended messages are put in
    # their recorded form after it, so the stored request scrubs that secret too.
    append = [
        _recorded_form(message if note is None else {**message, "note": note}, redactor, by_provider, contract)
        for message, note in pending
    ]
    request_bytes = turn.link(turn.chain.request, append)
    response_bytes = canonical(stored_response)
    request_ref, response_ref = sha256_ref(request_bytes), sha256_ref(response_bytes)
    body_out: dict[str, Any] = {
        "turn": turn.number,
        "provider": provider.name,
        "request": request_ref,
        "tools": turn.chain.tools,
        "response": response_ref,
        "replay_key": replay_key,
        "usage": {"input_tokens": response.usage.input_tokens, "output_tokens": response.usage.output_tokens},
        "stop_reason": response.stop_reason,
        "tool_calls": len(response.tool_calls),
    }
    if stored_response != raw_json:
        body_out["redacted"] = True
    blobs = {request_ref: request_bytes, response_ref: response_bytes}
    if not turn.chain.tools_stored:
        blobs[turn.chain.tools] = turn.chain.tools_bytes
    # A turn that proposes calls is committed without its own flush: the first thing the gate records
    # for its first call (an intent, a denial, an approval request) is committed durably after it, and
    # one flush makes both durable (the store commits in order), before anything depends on the turn.
    # A turn without calls (the final answer) is flushed at once: reviewers may read it next.
    [entry] = await journal.append(Record("model_turn", body_out, blobs), durable=not response.tool_calls)
    turn.chain.tools_stored = True
    turn.advance(request_ref, replay_key)
    if events is not None:
        events.model_answered(turn.number, entry, replayed=False)
    return response
