"""The gate: the one path from a requested tool call to a server (DESIGN section 4).

For each call, in this order:

1. resolve the namespaced tool; unknown or unmounted -> denied (``not_mounted``); arguments that
   did not parse or do not fit the tool's input schema -> denied (``bad_arguments``); arguments
   holding a known secret value the server was not given (a provider's API key, another server's
   token: ``Redactor.foreign_secret``) -> denied (``secret``), whatever the policy says;
2. ``policy.decide`` -> Allow | Deny | Ask;
3. ``budget.charge_call`` under a lock, before the call, so concurrent calls never overspend;
4. Deny or Exceeded -> ``mcp_tool_denied`` and an ``isError`` result the model can read;
5. Ask -> ``approval_requested`` and the call reports ``suspended`` (the loop suspends the run
   once the turn's other calls are done); after ``truss approve`` a resumed run passes here again
   and finds the decision recorded;
6. replay: when the session's record already holds this call's outcome (a resumed run), that
   outcome is returned and nothing is sent; an intent without a result is *in doubt*;
7. ``mcp_tool_intent`` (durable in "power" mode), the call, ``mcp_tool_call`` (always durable)
   before the result goes back to the model. A result over ``max_result_bytes`` (measured here,
   or already refused by the transport) is recorded as a failure with ``cause = result_too_large``.
   Elicitation requests the server made during the call, and the answers the MCP tier gave them
   by the server's policy (``truss.elicitation``), are recorded in the same ``mcp_tool_call``.

The gate's helpers each have a module: ``truss.journal`` (appending, the index of what a resumed
run finds, replay matching), ``truss.redaction`` (secrets out of everything stored),
``truss.input_schema`` (step 1's argument check), ``truss.pending`` (MCP tasks and signals: calls
that finish later), ``truss.calls`` (the request and outcome values) and ``truss.events`` (the
call spans it emits). This module does no I/O of its own: the store and the transport are passed
in; it never imports the MCP SDK.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from truss import _faults
from truss import budget as budget_mod
from truss import pending as pending_mod
from truss import policy as policy_mod
from truss._clock import Clock
from truss._errors import LoginRequiredError, McpError, PinMismatchError, ToolCallError
from truss._json import loads
from truss._memo import MemoIndex
from truss.budget import BudgetState, Charged, Exceeded
from truss.calls import CallOutcome, CallRequest, Outcome, waiting
from truss.contract import Contract
from truss.contract import duration_ms as _duration_ms
from truss.elicitation import CallElicitations, request_document
from truss.events import ProgressEvent, RunEvents
from truss.input_schema import check_arguments
from truss.journal import IN_FLIGHT, Journal, RecordedCall
from truss.ledger.canonical import CanonicalError, canonical, number_problem, sha256_ref
from truss.ledger.entry import Record, StoredEntry
from truss.redaction import REDACTED, Redactor
from truss.tools import MountedTool, ProgressFn, ToolResult, ToolTransport, error_result, split_namespaced

__all__ = [
    "REDACTED",
    "CallOutcome",
    "CallRequest",
    "Gate",
    "Journal",
    "ProgressEvent",
    "RecordedCall",
    "Redactor",
    "check_arguments",
]

_T = TypeVar("_T")
_DECISIONS: dict[type, str] = {policy_mod.Deny: "deny", policy_mod.Ask: "ask"}
_TASK_WAIT = "waiting for a task to finish (truss resume polls it again)"


@dataclass
class _Budget:
    # Read, charged and swapped with no await in between: on the run's one event loop no other call
    # can interleave, so concurrent calls never overspend and no lock is needed.
    state: BudgetState


class Gate:
    """Every tool call of one run passes ``Gate.call``; there is no other path to a server."""

    def __init__(
        self,
        *,
        contract: Contract,
        journal: Journal,
        transport: ToolTransport,
        tools: Mapping[str, MountedTool],
        clock: Clock,
        budget: BudgetState,
        redactor: Redactor,
        events: RunEvents | None = None,
        started_monotonic: float | None = None,
    ) -> None:
        """``started_monotonic``: ``clock.monotonic()`` read when ``budget`` was started (with its
        ``started_ms``); without it the gate takes both clocks when it is made."""
        self.contract = contract
        self.journal = journal
        self.transport = transport
        self.tools = tools
        self.clock = clock
        self._budget = _Budget(budget)
        if started_monotonic is None:
            self._wall0, self._mono0 = clock.now_ms(), clock.monotonic()
        else:
            self._wall0, self._mono0 = budget.started_ms, started_monotonic
        self.redactor = redactor
        self._events = events
        self._intent_durable = contract.ledger.durability == "power"
        self._memo: MemoIndex | None = None
        self._decisions: dict[str, str] = {}  # call -> the policy's decision in this leg (for events)
        self._timeouts: dict[str, float] = {}  # tool -> its configured call_timeout, in seconds
        self._remaining: tuple[BudgetState, int, dict[str, Any]] | None = None  # the last remaining()

    # -- budget shared with the loop (model turns are charged against the same state) --

    @property
    def budget(self) -> BudgetState:
        return self._budget.state

    def budget_now_ms(self) -> int:
        """The ``now_ms`` budget functions are given: the wall time the budget was started at plus the
        monotonic time since, so a wall clock set back (by an operator, by NTP) never adds time
        before the deadline and one set ahead never takes any."""
        return self._wall0 + round((self.clock.monotonic() - self._mono0) * 1000)

    async def charge(self, charge: Callable[[BudgetState], _T]) -> _T:
        """Apply a budget function to the shared state; swap it in when charged (atomically: no await)."""
        result = charge(self._budget.state)
        if isinstance(result, Charged):
            self._budget.state = result.state
        elif isinstance(result, Exceeded) and result.state is not None:
            self._budget.state = result.state  # tokens a provider already spent count even past the limit
        return result

    async def _charge_call(self, tool: str) -> Charged | Exceeded:
        return await self.charge(lambda state: budget_mod.charge_call(state, self.contract, tool, self.budget_now_ms()))

    def remaining(self) -> dict[str, Any]:
        """What is left of the budget now (``budget.remaining``), a fresh copy for each caller."""
        state, now = self._budget.state, self.budget_now_ms()
        held = self._remaining
        if held is None or held[0] is not state or held[1] != now:
            # A call's end event and the note the loop adds to its result ask in the same millisecond
            # with the same budget state: worked out once.
            held = self._remaining = (state, now, budget_mod.remaining(self.contract, state, now))
        return {k: dict(cast(dict[str, int], v)) if type(v) is dict else v for k, v in held[2].items()}

    def _call_timeout_s(self, tool: str) -> float:
        # What the contract configures is fixed for the run: looked up once per tool, then only the
        # deadline's time left is computed per call (same result as ``budget.call_timeout_s``).
        configured = self._timeouts.get(tool)
        if configured is None:
            configured = self._timeouts[tool] = budget_mod.configured_timeout_s(self.contract, tool)
        return min(configured, budget_mod.time_left_s(self.contract, self._budget.state, self.budget_now_ms()))

    # -- the call --

    async def call(self, request: CallRequest) -> CallOutcome:
        try:
            return await self._observed(request)
        finally:
            self.journal.release(request.call)  # its outcome is on the record; a leg never asks again

    async def _observed(self, request: CallRequest) -> CallOutcome:
        events = self._events
        if events is None or not events.active:
            return await self._call(request)
        server = server_of(request.tool)
        events.call_started(request.call, request.tool, server, request.turn)
        try:
            outcome = await self._call(request)
        except BaseException as exc:
            events.call_ended(request.call, request.tool, server, request.turn, outcome="error",
                              code=type(exc).__name__, decision=self._decisions.pop(request.call, None),
                              entry=self._last_entry(request.call))  # fmt: skip
            raise
        events.call_ended(
            request.call, request.tool, server, request.turn, outcome=outcome.outcome, code=outcome.code,
            reason=outcome.reason, limit=outcome.limit, decision=self._decisions.pop(request.call, None),
            duration_ms=outcome.duration_ms, replayed=outcome.replayed, entry=self._last_entry(request.call),
            budget_left=self.remaining(),
        )  # fmt: skip
        return outcome

    def _last_entry(self, call: str) -> StoredEntry | None:
        recorded = self.journal.calls.get(call)
        return recorded.last if recorded is not None else None

    async def _call(self, request: CallRequest) -> CallOutcome:
        recorded = self.journal.calls.get(request.call)
        # 6. (checked first) a step the record already settled is returned as recorded: replaying
        # the recorded truth keeps a resumed run identical even where live budget order may differ.
        if recorded is not None and recorded.denied is not None:
            return self._replayed_denial(request, recorded.denied)
        if recorded is not None and recorded.result is not None:
            return await self._replayed_result(request, recorded.result)
        if recorded is not None and recorded.pending is not None:
            return await self._awaited(request, recorded)
        # 1. resolve
        tool = self.tools.get(request.tool)
        if tool is None:
            why = f"tool {request.tool!r} is not mounted in this run"
            return await self._deny(request, None, code="not_mounted", reason=why)
        server = self.contract.mcp.server(tool.server)
        if server is None:  # a mount the contract does not declare is never callable
            why = f"tool {request.tool!r} belongs to no server of this contract"
            return await self._deny(request, None, code="not_mounted", reason=why)
        if request.arguments is None:
            raw = self.redactor.scrub_text((request.raw_arguments or "")[:200])
            why = f"the arguments of this call are not a JSON object (received {raw!r}); send a JSON object"
            return await self._deny(request, None, code="bad_arguments", reason=why)
        arguments = dict(request.arguments)
        stored_args = self.redactor.redact_arguments(tool.server, arguments)
        problem = check_arguments(tool.input_schema, arguments)
        if problem is not None:
            return await self._deny(
                request, stored_args, code="bad_arguments", reason=f"{problem} (see the tool's input schema)"
            )
        # A known secret (a provider's API key, another server's token) is never sent to a server
        # that was not given it, whatever the policy says: the model may have been shown it.
        leaked = self.redactor.foreign_secret(tool.server, arguments)
        if leaked is not None:
            why = (f"the arguments hold {leaked}, which server {tool.server!r} was not given; Truss never sends a "
                   "known secret to another server")  # fmt: skip
            return await self._deny(request, stored_args, code="secret", reason=why)
        # 2. policy
        decision = policy_mod.decide(self.contract, tool.name, arguments, self.tools)
        if self._events is not None:
            self._decisions[request.call] = _DECISIONS.get(type(decision), "allow")
        if isinstance(decision, policy_mod.Deny):
            return await self._deny(
                request, stored_args, code=decision.code, reason=decision.reason, rule=decision.rule
            )
        if isinstance(decision, policy_mod.Ask):
            waits = await self._approval(request, stored_args, decision, recorded)
            if waits is not None:
                return waits
        # memo: an identical earlier call within the tool's TTL is answered from the record
        if recorded is None or recorded.intent is None:
            hit = self._memo_hit(tool, arguments, stored_args)
            if hit is not None:
                return await self._memoized(request, tool, stored_args, hit)
        # 3. budget, charged before the call
        charged = await self._charge_call(tool.name)
        if isinstance(charged, Exceeded):
            return await self._deny(request, stored_args, code="budget", reason=f"budget exhausted: {charged.detail}",
                                    limit=str(charged.limit))  # fmt: skip
        # 6. an intent without a result: in doubt
        if recorded is not None and recorded.intent is not None:
            self.journal.match(request.call, request.tool, stored_args, recorded.intent)
            if recorded.resolved is not None:
                settled = await self._resolved(request, recorded)
                if settled is not None:
                    return settled
            elif tool.tool not in server.retry_in_doubt:
                await self.journal.in_doubt(request.call, request.tool, recorded)
        # 7. intent, call, result
        return await self._execute(request, tool, arguments, stored_args)

    async def _execute(
        self, request: CallRequest, tool: MountedTool, arguments: dict[str, Any], stored_args: dict[str, Any]
    ) -> CallOutcome:
        IN_FLIGHT.add(1)
        try:
            return await self._send(request, tool, arguments, stored_args)
        finally:
            IN_FLIGHT.add(-1)

    async def _send(
        self, request: CallRequest, tool: MountedTool, arguments: dict[str, Any], stored_args: dict[str, Any]
    ) -> CallOutcome:
        args_bytes = canonical(stored_args)
        args_ref = sha256_ref(args_bytes)
        _faults.fault("before_intent")
        [intent] = await self.journal.append(
            Record(
                "mcp_tool_intent",
                {"call": request.call, "turn": request.turn, "tool": tool.name, "args": args_ref, "pin": tool.pin},
                {args_ref: args_bytes},
            ),
            durable=self._intent_durable,
        )
        _faults.fault("after_intent")
        timeout_s = self._call_timeout_s(tool.name)
        started = self.clock.monotonic()
        failure: dict[str, Any] | None = None
        login_needed: LoginRequiredError | None = None
        try:
            if timeout_s <= 0:
                raise ToolCallError(
                    f"no time left before the run's deadline to call {tool.name}",
                    server=tool.server,
                    tool=tool.tool,
                    cause="timeout",
                )
            invoked = await self._invoke(request, tool, arguments, timeout_s, intent)
            if invoked is None:  # a task that still runs: recorded as pending, the run suspends
                return waiting(request, "task", _TASK_WAIT)
            result = invoked
            elicited: Any = result.extra.get("elicitations")
        except McpError as exc:  # ToolCallError, or PinMismatchError after the server changed the tool
            failure, result = self._failed(exc)
            elicited = exc.fields.get("elicitations")
            # An OAuth server that needs a person (a scope step-up): recorded as this call's failure,
            # then the run stops with the "log in again" message (docs/oauth.md).
            login_needed = exc if isinstance(exc, LoginRequiredError) else None
        _faults.fault("after_call")
        duration_ms = round((self.clock.monotonic() - started) * 1000, 3)
        wire: Any = self.redactor.scrub(dict(result.wire))
        result = ToolResult(wire, result.extra)
        result_bytes = canonical(wire)
        too_large = self._too_large(tool, result, len(result_bytes))
        if too_large is not None:
            result, result_bytes, failure = too_large
        result_ref = sha256_ref(result_bytes)
        body: dict[str, Any] = {
            "call": request.call,
            "turn": request.turn,
            "tool": tool.name,
            "args": args_ref,
            "result": result_ref,
            "is_error": result.is_error,
            "duration_ms": round(duration_ms),  # whole milliseconds: entry bodies hold no floats
            "pin": tool.pin,
            "intent": intent.seq,
        }
        if isinstance(result.extra.get("task_id"), str):
            body["task"] = result.extra["task_id"]
        blobs = {result_ref: result_bytes}
        if isinstance(elicited, CallElicitations):
            self._record_elicitations(body, blobs, elicited)
        if failure is not None:
            body["failure"] = failure
        elif (signal := pending_mod.signal_name(self.contract, tool, result)) is not None:
            await self.journal.append(pending_mod.pending_signal(body, signal, result_bytes), durable=True)
            return waiting(request, "signal", f"waiting for signal {signal!r}")
        # Durable before dependent: the model sees the result only after it is committed.
        await self.journal.append(Record("mcp_tool_call", body, blobs), durable=True)
        if login_needed is not None:
            raise login_needed
        _faults.fault("after_result")
        return CallOutcome(request.call, tool.name, _outcome(failure, result), result, duration_ms,
                           code=failure["cause"] if failure else None)  # fmt: skip

    def _record_elicitations(self, body: dict[str, Any], blobs: dict[str, bytes], elicited: CallElicitations) -> None:
        """The call's ``elicitations``: per request its mode, the answer, and refs of the request and content."""
        records: list[dict[str, Any]] = []
        for item in elicited.records:
            ans = item.answer
            entry: dict[str, Any] = {"mode": item.mode, "action": ans.action, "reason": ans.reason}
            if ans.detail:
                entry["detail"] = self.redactor.scrub_text(ans.detail)
            for key, value in (("request", request_document(item)), ("content", ans.content)):
                if value is None:
                    continue
                try:
                    data = canonical(self.redactor.scrub(value))
                except (CanonicalError, RecursionError):
                    entry[key] = None  # answered "decline" (unrecordable): nothing but that is kept
                    continue
                ref = sha256_ref(data)
                blobs[ref] = data
                entry[key] = ref
            if item.calls_in_flight > 1:
                entry["calls_in_flight"] = item.calls_in_flight
            records.append(entry)
        body["elicitations"] = records
        if elicited.unrecorded:
            body["elicitations_unrecorded"] = elicited.unrecorded

    def _failed(self, exc: McpError) -> tuple[dict[str, Any], ToolResult]:
        """The recorded ``failure`` and the model's error result for a call that failed below the tool."""
        cause = str(exc.fields.get("cause") or ("pin_changed" if isinstance(exc, PinMismatchError) else "transport"))
        text = self.redactor.scrub_text(f"the call failed below the tool ({cause}): {exc.message}")
        failure: dict[str, Any] = {"cause": cause, "retryable": exc.retryable}
        code = exc.fields.get("code")
        if cause == "server_error" and type(code) is int and number_problem(code) is None:
            failure["code"] = code  # the JSON-RPC error code the server answered with
        status = exc.fields.get("status")
        if isinstance(status, int) and not isinstance(status, bool):
            failure["status"] = status  # an HTTP refusal (cause auth_failed): 401, 403
        if cause == "sandbox_limit":  # which kernel limit stopped the server, and what shows it
            failure.update({k: str(exc.fields[k]) for k in ("limit", "evidence") if exc.fields.get(k) is not None})
        return failure, error_result(text)

    def _too_large(
        self, tool: MountedTool, result: ToolResult, size: int
    ) -> tuple[ToolResult, bytes, dict[str, Any]] | None:
        """One recorded form for an over-size result, whether the transport refused it (``extra``
        ``refused = max_result_bytes``) or its recorded bytes are over the limit here."""
        refused = result.extra.get("refused") == "max_result_bytes"
        if not refused and not budget_mod.result_too_large(self.contract, size):
            return None
        measured: Any = result.extra.get("result_bytes") if refused else size
        if refused and result.extra.get("partial"):
            measured = f"more than {measured}"  # refused as it arrived, before it was whole
        limit = self.contract.budget.max_result_bytes
        text = f"the result of {tool.name} was {measured} bytes, over max_result_bytes ({limit}); it was refused"
        error = error_result(text)
        return error, canonical(dict(error.wire)), {"cause": "result_too_large", "retryable": False}

    def _progress(self, request: CallRequest) -> ProgressFn | None:
        events = self._events
        if events is None or not events.active:
            return None

        async def report(progress: float, total: float | None, message: str | None) -> None:
            _faults.fault("during_call")  # the server has the request: it reports progress on it
            detail = f"{progress:g}" + (f"/{total:g}" if total else "") + (f" {message}" if message else "")
            events.tool_progress(request.call, request.tool, request.turn, self.redactor.scrub_text(detail)[:200])

        return report

    def _stored_args(self, request: CallRequest) -> dict[str, Any] | None:
        """The arguments as recorded: secret fields redacted, known secret values scrubbed."""
        if request.arguments is None:
            return None
        tool = self.tools.get(request.tool)
        server = tool.server if tool is not None else (server_of(request.tool) or "")
        return self.redactor.redact_arguments(server, request.arguments)

    async def _deny(
        self,
        request: CallRequest,
        stored_args: dict[str, Any] | None,
        *,
        code: str,
        reason: str,
        rule: int | None = None,
        limit: str | None = None,
    ) -> CallOutcome:
        if stored_args is None and request.arguments is not None:
            stored_args = self._stored_args(request)
        reason = self.redactor.scrub_text(reason)
        body: dict[str, Any] = {"call": request.call, "turn": request.turn, "tool": request.tool, "code": code}
        blobs: dict[str, bytes] = {}
        if stored_args is not None:
            args_bytes = canonical(stored_args)
            body["args"] = sha256_ref(args_bytes)
            blobs[body["args"]] = args_bytes
        if rule is not None:
            body["rule"] = rule
        if limit is not None:
            body["limit"] = limit
        body["reason"] = reason
        [entry] = await self.journal.append(Record("mcp_tool_denied", body, blobs), durable=True)
        if self._events is not None:
            self._events.call_denied(request.call, request.tool, request.turn, entry)
        return CallOutcome(request.call, request.tool, "denied", error_result(f"denied ({code}): {reason}"),
                           code=code, reason=reason, limit=limit)  # fmt: skip

    async def _approval(
        self, request: CallRequest, stored_args: dict[str, Any], decision: policy_mod.Ask, recorded: RecordedCall | None
    ) -> CallOutcome | None:
        """None when a recorded approval lets the call go on; otherwise the outcome to return."""
        if recorded is not None and recorded.requested is not None:
            self.journal.match(request.call, request.tool, stored_args, recorded.requested)
            if recorded.decided is None:
                return waiting(request, "approval", decision.reason, replayed=True, text="waiting for approval")
            decided: Mapping[str, Any] = recorded.decided.body
            if decided.get("approved") is True:
                return None
            why = "a person denied this call" + (f": {decided['reason']}" if decided.get("reason") else "")
            return await self._deny(request, stored_args, code="approval_denied", reason=why, rule=decision.rule)
        args_bytes = canonical(stored_args)
        args_ref = sha256_ref(args_bytes)
        body: dict[str, Any] = {
            "call": request.call,
            "turn": request.turn,
            "tool": request.tool,
            "args": args_ref,
            "rule": decision.rule,
            "reason": self.redactor.scrub_text(decision.reason),
        }
        await self.journal.append(Record("approval_requested", body, {args_ref: args_bytes}), durable=True)
        return waiting(request, "approval", decision.reason, text="waiting for approval")

    # -- durability: resolved in-doubt calls, tasks, signals, memo (docs/durability.md) --

    async def _settle(
        self,
        request: CallRequest,
        recorded_from: Mapping[str, Any],
        result_bytes: bytes,
        extra: Mapping[str, Any],
        *,
        failure: dict[str, Any] | None = None,
        duration_ms: float = 0.0,
    ) -> CallOutcome:
        """Record ``result_bytes`` (already canonical, already scrubbed) as the call's ``mcp_tool_call``."""
        wire: Any = json.loads(result_bytes)
        result = ToolResult(wire)
        result_ref = sha256_ref(result_bytes)
        body: dict[str, Any] = {
            "call": request.call,
            "turn": request.turn,
            "tool": request.tool,
            "args": recorded_from.get("args"),
            "result": result_ref,
            "is_error": result.is_error,
            "duration_ms": round(duration_ms),
            "pin": recorded_from.get("pin"),
        }
        body.update(extra)
        if failure is not None:
            body["failure"] = failure
        await self.journal.append(Record("mcp_tool_call", body, {result_ref: result_bytes}), durable=True)
        code = failure["cause"] if failure else (str(next(iter(extra))) if extra else None)
        return CallOutcome(request.call, request.tool, _outcome(failure, result), result, duration_ms, code=code)

    async def _resolved(self, request: CallRequest, recorded: RecordedCall) -> CallOutcome | None:
        """The operator's answer to an in-doubt call (``truss resolve``); None: it was not sent, send it."""
        assert recorded.resolved is not None and recorded.intent is not None
        body: Mapping[str, Any] = recorded.resolved.body
        if body.get("resolution") == "not_sent":
            return None
        data = self.journal.payload(request.call, recorded.resolved, body.get("result"))
        failure = {"cause": "in_doubt_failed", "retryable": False} if body.get("resolution") == "failed" else None
        extra = {"resolved": recorded.resolved.seq, "intent": recorded.intent.seq}
        return await self._settle(request, recorded.intent.body, data, extra, failure=failure)

    async def _awaited(self, request: CallRequest, recorded: RecordedCall) -> CallOutcome:
        """A call recorded as pending: its signal's payload once delivered, else it still waits."""
        pending = recorded.pending
        assert pending is not None
        self.journal.match(request.call, request.tool, self._stored_args(request), pending)
        body: Mapping[str, Any] = pending.body
        if body.get("kind") == "task":
            return await self._poll_task(request, recorded)
        if recorded.signal is None:
            return waiting(request, "signal", f"waiting for signal {body.get('signal')!r}", replayed=True)
        # Charged when it ran live, in an earlier process: charge again so the resumed state matches.
        await self._charge_call(request.tool)
        signal = recorded.signal
        data = self.journal.payload(request.call, signal, signal.body.get("result"))
        extra = {"signal": signal.seq, "intent": body.get("intent")}
        return await self._settle(request, body, data, extra, duration_ms=float(max(0, signal.ts - pending.ts)))

    async def _invoke(
        self, request: CallRequest, tool: MountedTool, arguments: dict[str, Any], timeout_s: float, intent: StoredEntry
    ) -> ToolResult | None:
        """Send the call: as an MCP task when the transport runs this tool as one (then ``mcp_tool_pending``
        records the task id before Truss waits), else as a plain call. None: the task still runs."""
        progress = self._progress(request)
        tasks = pending_mod.task_transport(self.transport)
        task_id = await tasks.start_task(tool, arguments, timeout_s=timeout_s) if tasks is not None else None
        if tasks is None or task_id is None:
            return await self.transport.call(tool, arguments, timeout_s=timeout_s, progress=progress)
        await self.journal.append(pending_mod.pending_task(intent, task_id), durable=True)
        _faults.fault("task_pending")
        return await pending_mod.task_result(tasks, tool, task_id, self._call_timeout_s(tool.name), progress)

    async def _poll_task(self, request: CallRequest, recorded: RecordedCall) -> CallOutcome:
        """A call recorded as a pending MCP task: poll the same task; unknown to the server -> in doubt."""
        pending = recorded.pending
        assert pending is not None
        tool = self.tools.get(request.tool)
        tasks = pending_mod.task_transport(self.transport)
        if tool is None or tasks is None:
            raise self.journal.divergence(request.call, pending, f"{request.tool}, which cannot be polled in this run")
        await self._charge_call(tool.name)
        arguments = dict(request.arguments or {})
        stored_args = self.redactor.redact_arguments(tool.server, arguments)
        if recorded.resolved is not None:
            settled = await self._resolved(request, recorded)
            return settled if settled is not None else await self._execute(request, tool, arguments, stored_args)
        failure: dict[str, Any] | None = None
        try:
            task_id, left = str(pending.body.get("task")), self._call_timeout_s(tool.name)
            result = await pending_mod.task_result(tasks, tool, task_id, left, self._progress(request))
        except McpError as exc:
            if exc.fields.get("cause") == "task_unknown":
                server = self.contract.mcp.server(tool.server)
                if server is not None and tool.tool in server.retry_in_doubt:
                    return await self._execute(request, tool, arguments, stored_args)
                await self.journal.in_doubt(request.call, request.tool, recorded)
            failure, result = self._failed(exc)
        if result is None:
            return waiting(request, "task", _TASK_WAIT)
        data = canonical(self.redactor.scrub(dict(result.wire)))
        too_large = self._too_large(tool, result, len(data))
        if too_large is not None:
            _, data, failure = too_large
        extra = {"task": pending.body.get("task"), "intent": pending.body.get("intent")}
        return await self._settle(request, pending.body, data, extra, failure=failure,
                                  duration_ms=float(max(0, self.clock.now_ms() - pending.ts)))  # fmt: skip

    def _memo_hit(self, tool: MountedTool, arguments: Mapping[str, Any], stored_args: Any) -> StoredEntry | None:
        server = self.contract.mcp.server(tool.server)
        settings = server.tool_settings(tool.tool) if server is not None else None
        if settings is None or settings.memo is None:
            return None
        if stored_args != arguments:  # secret arguments were redacted: the record cannot tell two calls apart
            return None
        if self._memo is None:
            self._memo = MemoIndex(self.journal.store, self.contract, session=self.journal.session)
        args_ref = sha256_ref(canonical(stored_args))
        return self._memo.lookup(tool, args_ref, now_ms=self.clock.now_ms(), ttl_ms=_duration_ms(settings.memo))

    async def _memoized(
        self, request: CallRequest, tool: MountedTool, stored_args: dict[str, Any], hit: StoredEntry
    ) -> CallOutcome:
        if self.contract.budget.charge_memo_hits:
            charged = await self._charge_call(tool.name)
            if isinstance(charged, Exceeded):
                why = f"budget exhausted: {charged.detail}"
                return await self._deny(request, stored_args, code="budget", reason=why, limit=str(charged.limit))
        data = self.journal.payload(request.call, hit, hit.body.get("result"))
        origin = {"session": hit.session, "seq": hit.seq, "hash": hit.hash}
        return await self._settle(request, {"args": hit.body.get("args"), "pin": tool.pin}, data,
                                  {"replayed_from": origin})  # fmt: skip

    def _replayed_denial(self, request: CallRequest, entry: StoredEntry) -> CallOutcome:
        self.journal.match(request.call, request.tool, self._stored_args(request), entry)
        body: Mapping[str, Any] = entry.body
        code, reason = str(body.get("code")), str(body.get("reason"))
        limit: Any = body.get("limit")
        return CallOutcome(request.call, request.tool, "denied", error_result(f"denied ({code}): {reason}"),
                           code=code, reason=reason, replayed=True, limit=limit)  # fmt: skip

    async def _replayed_result(self, request: CallRequest, entry: StoredEntry) -> CallOutcome:
        self.journal.match(request.call, request.tool, self._stored_args(request), entry)
        body: Mapping[str, Any] = entry.body
        data = self.journal.payload(request.call, entry, body["result"], what="result")
        # The call was charged when it ran; charge it again so the resumed state matches. The
        # recorded outcome stands even if live charging order would now differ.
        if "replayed_from" not in body or self.contract.budget.charge_memo_hits:
            await self._charge_call(str(body.get("tool")))
        wire: Any = loads(data)
        failure: Any = body.get("failure")
        code = str(cast(Mapping[str, Any], failure).get("cause")) if isinstance(failure, Mapping) else None
        outcome: Outcome = "failed" if code is not None else "tool_error" if body.get("is_error") else "ok"
        return CallOutcome(request.call, request.tool, outcome, ToolResult(wire), float(body.get("duration_ms", 0)),
                           code=code, replayed=True)  # fmt: skip


def _outcome(failure: Mapping[str, Any] | None, result: ToolResult) -> Outcome:
    if failure is not None:
        return "failed"
    return "tool_error" if result.is_error else "ok"


def server_of(tool: str) -> str | None:
    parts = split_namespaced(tool)
    return parts[0] if parts else None
