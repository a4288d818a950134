"""The gate: the one path from a requested tool call to a server (DESIGN section 4).

For each call, in this order:

1. resolve the namespaced tool; unknown or unmounted -> denied (``not_mounted``); arguments that
   did not parse or do not fit the tool's input schema -> denied (``bad_arguments``);
2. ``policy.decide`` -> Allow | Deny | Ask;
3. ``budget.charge_call`` under a lock, before the call, so concurrent calls never overspend;
4. Deny or Exceeded -> ``mcp_tool_denied`` and an ``isError`` result the model can read;
5. Ask -> ``approval_requested`` and the call reports ``suspended`` (the loop suspends the run
   once the turn's other calls are done); after ``truss approve`` a resumed run passes here again
   and finds the decision recorded;
6. replay: when the session's record already holds this call's outcome (a resumed run), that
   outcome is returned and nothing is sent; an intent without a result is *in doubt*;
7. ``mcp_tool_intent`` (durable in "power" mode), the call, ``mcp_tool_call`` (always durable)
   before the result goes back to the model.

Secrets: ``secret_args`` fields are replaced by ``"[redacted]"`` before anything is hashed or
stored, and every known secret value (secret arguments of this run, ``secret_env`` values) is
scrubbed from every blob the session stores (``Redactor``). Hashes of secrets are never recorded:
a hash of a short secret is a dictionary-attack target.

The ``Journal`` appends one session's records in order and indexes what a resumed run finds
already recorded; the loop and the session code use it too. This module does no I/O of its own:
the store and the transport are passed in; it never imports the MCP SDK.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import anyio

from truss import _faults
from truss import budget as budget_mod
from truss import policy as policy_mod
from truss._clock import Clock
from truss._errors import InDoubtError, McpError, PinMismatchError, ReplayDivergenceError, ToolCallError
from truss._memo import MemoIndex
from truss.budget import BudgetState, Charged, Exceeded
from truss.contract import Contract
from truss.contract import duration_ms as _duration_ms
from truss.ledger.canonical import canonical, sha256_ref
from truss.ledger.entry import Record, StoredEntry
from truss.tools import MountedTool, ToolResult, ToolTransport, error_result, split_namespaced
from truss.verdict import resolve_pointer

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

REDACTED = "[redacted]"
_MIN_SCRUB_LEN = 4  # shorter "secrets" would scrub ordinary text; they are too weak to protect anyway

Outcome = Literal["ok", "tool_error", "failed", "denied", "suspended"]


# -- progress -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProgressEvent:
    """What the CLI prints on stderr and serve-mcp turns into progress notifications.

    ``kind``: ``call`` (a gate outcome), ``turn`` (a model turn), ``tool_progress`` (a server's
    progress notification), ``suspended``, ``verdict``. Never carries arguments or results.
    """

    kind: str
    session: str
    call: str | None = None
    tool: str | None = None
    outcome: str | None = None
    duration_ms: float | None = None
    detail: str | None = None
    budget_left: Mapping[str, Any] | None = None
    replayed: bool = False


ProgressSink = Callable[[ProgressEvent], None]


# -- secrets ------------------------------------------------------------------------------------


class Redactor:
    """Redacts ``secret_args`` fields and scrubs known secret values from anything stored.

    Values live only in this object's memory; nothing derived from them (not even a hash) is
    written anywhere.
    """

    def __init__(self, contract: Contract, environ: Mapping[str, str]) -> None:
        self._secret_fields: dict[str, tuple[str, ...]] = {s.name: tuple(s.secret_args) for s in contract.mcp.servers}
        self._values: set[str] = set()
        for server in contract.mcp.servers:
            names = list(server.secret_env)
            names += [h.secret_env for h in server.headers.values() if not isinstance(h, str)]
            for name in names:
                value = environ.get(name)
                if value:
                    self.remember(value)
        self._pattern: re.Pattern[str] | None = None

    def remember(self, value: str) -> None:
        if len(value) >= _MIN_SCRUB_LEN and value not in self._values:
            self._values.add(value)
            self._pattern = None

    def redact_arguments(self, server: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """A copy with ``secret_args`` fields replaced by ``"[redacted]"``; their values are remembered.

        A field is a top-level argument name, or a JSON pointer (``/auth/token``) into nested objects.
        """
        out: dict[str, Any] = _deep_copy(dict(arguments))
        for spec in self._secret_fields.get(server, ()):
            path = (
                [p.replace("~1", "/").replace("~0", "~") for p in spec[1:].split("/")]
                if spec.startswith("/")
                else [spec]
            )
            holder: dict[str, Any] | None = out
            for part in path[:-1]:
                holder = _as_dict(holder.get(part)) if holder is not None else None
            if holder is not None and path[-1] in holder:
                self._remember_all(holder[path[-1]])
                holder[path[-1]] = REDACTED
        return self.scrub(out)

    def _remember_all(self, value: Any) -> None:
        if isinstance(value, str):
            self.remember(value)
        elif isinstance(value, dict):
            for item in value.values():  # pyright: ignore[reportUnknownVariableType]
                self._remember_all(item)
        elif isinstance(value, list):
            for item in value:  # pyright: ignore[reportUnknownVariableType]
                self._remember_all(item)

    def scrub(self, value: Any) -> Any:
        """``value`` with every known secret value inside its strings replaced by ``"[redacted]"``."""
        if not self._values:
            return value
        if self._pattern is None:
            ordered = sorted(self._values, key=len, reverse=True)  # longest first: no partial leftovers
            self._pattern = re.compile("|".join(re.escape(v) for v in ordered))
        return _scrub(value, self._pattern)

    def scrub_text(self, text: str) -> str:
        scrubbed: Any = self.scrub(text)
        return scrubbed if isinstance(scrubbed, str) else text


def _scrub(value: Any, pattern: re.Pattern[str]) -> Any:
    if isinstance(value, str):
        return pattern.sub(REDACTED, value)
    if isinstance(value, dict):
        return {_scrub(k, pattern): _scrub(v, pattern) for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, list | tuple):
        return [_scrub(v, pattern) for v in value]  # pyright: ignore[reportUnknownVariableType]
    return value


def _as_dict(value: Any) -> dict[str, Any] | None:
    return cast(dict[str, Any], value) if isinstance(value, dict) else None


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, list | tuple):
        return [_deep_copy(v) for v in value]  # pyright: ignore[reportUnknownVariableType]
    return value


# -- the journal ---------------------------------------------------------------------------------


@dataclass
class RecordedCall:
    """What a session's record holds for one call id (for replay on resume)."""

    call: str
    requested: StoredEntry | None = None  # approval_requested
    decided: StoredEntry | None = None  # approval_decided
    denied: StoredEntry | None = None  # mcp_tool_denied
    intent: StoredEntry | None = None  # mcp_tool_intent
    result: StoredEntry | None = None  # mcp_tool_call
    in_doubt: StoredEntry | None = None
    resolved: StoredEntry | None = None  # in_doubt_resolved
    pending: StoredEntry | None = None  # mcp_tool_pending (a signal or an MCP task)
    signal: StoredEntry | None = None  # signal_received


_CALL_SLOTS = {
    "approval_requested": "requested",
    "approval_decided": "decided",
    "mcp_tool_denied": "denied",
    "mcp_tool_intent": "intent",
    "mcp_tool_call": "result",
    "in_doubt": "in_doubt",
    "in_doubt_resolved": "resolved",
    "mcp_tool_pending": "pending",
    "signal_received": "signal",
}


class _InFlight:
    """How many calls of this process are between their intent and their result (all runs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def add(self, delta: int) -> None:
        with self._lock:  # runs may live on several event loops (threads) of one process
            self.count += delta


IN_FLIGHT = _InFlight()


class Journal:
    """Appends one session's records, in order, and indexes the entries recorded before (resume).

    Where ``append`` runs the store's (synchronous, thread-safe, group-committing) ``append``:

    - on the event loop itself when the write needs no fsync, or when no other call is in flight
      in this process (``IN_FLIGHT``, over all runs: serve-mcp runs many at once): a thread
      hand-off costs more than such a write, and on a loaded machine several times more
      (docs/benchmarks.md, bench/gate.py);
    - in a worker thread when other calls are in flight, so their intents and results queue in the
      store together and share fsyncs (group commit) while the loop serves the others.

    Either way the write is never abandoned: a cancelled run still finishes the write it started,
    so there is never a half-recorded step. Blobs are scrubbed of secrets by the caller.
    """

    def __init__(self, store: Any, session: str, *, recorded: Iterable[StoredEntry] = ()) -> None:
        self.store = store
        self.session = session
        self.calls: dict[str, RecordedCall] = {}
        self.turns: dict[int, StoredEntry] = {}
        self.entries: list[StoredEntry] = []
        self.denials = 0
        for entry in recorded:
            self._index(entry)

    @property
    def head(self) -> StoredEntry | None:
        return self.entries[-1] if self.entries else None

    @property
    def next_seq(self) -> int:
        return self.entries[-1].seq + 1 if self.entries else 0

    def _index(self, entry: StoredEntry) -> None:
        self.entries.append(entry)
        kind = entry.kind
        body: Mapping[str, Any] = entry.body
        if kind == "model_turn":
            self.turns[int(body["turn"])] = entry
        slot = _CALL_SLOTS.get(kind)
        if slot is not None:
            call = str(body["call"])
            recorded = self.calls.setdefault(call, RecordedCall(call))
            setattr(recorded, slot, entry)
        if kind == "mcp_tool_denied":
            self.denials += 1

    async def append(self, *records: Record, durable: bool = True, expect_seq: int | None = None) -> list[StoredEntry]:
        def write() -> list[StoredEntry]:
            written: list[StoredEntry] = self.store.append(
                self.session, list(records), durable=durable, expect_seq=expect_seq
            )
            return written

        if not durable or IN_FLIGHT.count <= 1:
            stored = write()
            # Still a point where the run can be cancelled, without a trip through the event loop
            # (a full checkpoint is one more loop iteration per entry, ~5% of a fast call).
            await anyio.lowlevel.checkpoint_if_cancelled()
        else:
            stored = await anyio.to_thread.run_sync(write)
        for entry in stored:
            self._index(entry)
        return stored

    def blob(self, ref: str) -> bytes | None:
        data: bytes | None = self.store.blob(ref)
        return data


# -- requests and outcomes ------------------------------------------------------------------------


@dataclass(frozen=True)
class CallRequest:
    """A call the model proposed. ``call`` is ``c<turn>.<index>`` (deterministic, so resume can match);
    ``tool`` the namespaced name (the loop maps provider names back); ``arguments`` None when the
    model's JSON did not parse."""

    call: str
    tool: str
    arguments: Mapping[str, Any] | None
    turn: int
    raw_arguments: str | None = None
    model_call_id: str | None = None


@dataclass(frozen=True)
class CallOutcome:
    call: str
    tool: str
    outcome: Outcome
    result: ToolResult
    duration_ms: float = 0.0
    code: str | None = None  # denial code (not_mounted, rule, budget, approval_denied, ...) or failure cause
    reason: str | None = None
    replayed: bool = False
    limit: str | None = None  # the budget limit that was hit


# -- argument checks ------------------------------------------------------------------------------

_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def check_arguments(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` do not fit the tool's input schema at the top level, or None.

    Checks required properties and the declared JSON type of each given property: enough to send
    a model's type mistakes back to it as an error result instead of to the server. Deeper
    validation is the server's job (its errors come back as results too).
    """
    required: Any = schema.get("required") or []
    if isinstance(required, list):
        missing = [str(n) for n in cast(list[Any], required) if n not in arguments]
        if missing:
            return "missing required argument(s): " + ", ".join(missing)
    properties = _as_dict(schema.get("properties"))
    if properties is None:
        return None
    for name, value in arguments.items():
        spec = _as_dict(properties.get(name))
        if spec is None:
            continue
        declared: Any = spec.get("type")
        kinds: list[Any] = cast(list[Any], declared) if isinstance(declared, list) else [declared]
        checks = [_JSON_TYPES[k] for k in kinds if isinstance(k, str) and k in _JSON_TYPES]
        if checks and not any(check(value) for check in checks):
            return f"argument {name!r} must be of type {' or '.join(str(k) for k in kinds)}"
    return None


# -- the gate -------------------------------------------------------------------------------------


@dataclass
class _Budget:
    state: BudgetState
    # Charging is synchronous under the lock, so an uncontended acquire need not yield to the loop.
    lock: anyio.Lock = field(default_factory=lambda: anyio.Lock(fast_acquire=True))


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
        on_progress: ProgressSink | None = None,
    ) -> None:
        self.contract = contract
        self.journal = journal
        self.transport = transport
        self.tools = tools
        self.clock = clock
        self._budget = _Budget(budget)
        self.redactor = redactor
        self._on_progress = on_progress
        self._intent_durable = contract.ledger.durability == "power"
        self._memo: MemoIndex | None = None

    # -- budget shared with the loop (model turns are charged against the same state) --

    @property
    def budget(self) -> BudgetState:
        return self._budget.state

    async def charge(self, charge: Callable[[BudgetState], Any]) -> Any:
        """Apply a budget function to the shared state under the lock; swap it in when charged."""
        async with self._budget.lock:
            result = charge(self._budget.state)
            if isinstance(result, Charged):
                self._budget.state = result.state
            elif isinstance(result, Exceeded) and result.state is not None:
                self._budget.state = result.state  # tokens a provider already spent count even past the limit
            return result

    def remaining(self) -> dict[str, Any]:
        return dict(budget_mod.remaining(self.contract, self._budget.state, self.clock.now_ms()))

    # -- the call --

    async def call(self, request: CallRequest) -> CallOutcome:
        outcome = await self._call(request)
        if self._on_progress is not None:
            self._on_progress(
                ProgressEvent(
                    kind="call",
                    session=self.journal.session,
                    call=request.call,
                    tool=request.tool,
                    outcome=outcome.outcome,
                    duration_ms=outcome.duration_ms,
                    detail=outcome.code,
                    budget_left=self.remaining(),
                    replayed=outcome.replayed,
                )
            )
        return outcome

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
        # 2. policy
        decision = policy_mod.decide(self.contract, tool.name, arguments, self.tools)
        if isinstance(decision, policy_mod.Deny):
            return await self._deny(
                request, stored_args, code=decision.code, reason=decision.reason, rule=decision.rule
            )
        if isinstance(decision, policy_mod.Ask):
            waiting = await self._approval(request, stored_args, decision, recorded)
            if waiting is not None:
                return waiting
        # memo: an identical earlier call within the tool's TTL is answered from the record
        if recorded is None or recorded.intent is None:
            hit = self._memo_hit(tool, arguments, stored_args)
            if hit is not None:
                return await self._memoized(request, tool, stored_args, hit)
        # 3. budget, charged before the call
        charged = await self.charge(
            lambda state: budget_mod.charge_call(state, self.contract, tool.name, self.clock.now_ms())
        )
        if not isinstance(charged, Charged):
            exceeded: Any = charged
            return await self._deny(
                request,
                stored_args,
                code="budget",
                reason=f"budget exhausted: {exceeded.detail}",
                limit=str(exceeded.limit),
            )
        # 6. an intent without a result: in doubt
        if recorded is not None and recorded.intent is not None:
            self._match(request, stored_args, recorded.intent)
            if recorded.resolved is not None:
                settled = await self._resolved(request, tool, recorded)
                if settled is not None:
                    return settled
            elif tool.tool not in server.retry_in_doubt:
                await self._in_doubt(request, recorded)
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
        timeout_s = budget_mod.call_timeout_s(self.contract, tool.name, self._budget.state, self.clock.now_ms())
        started = self.clock.monotonic()
        failure: dict[str, Any] | None = None
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
                return self._task_waiting(request)
            result = invoked
        except McpError as exc:  # ToolCallError, or PinMismatchError after the server changed the tool
            cause = str(
                exc.fields.get("cause") or ("pin_changed" if isinstance(exc, PinMismatchError) else "transport")
            )
            failure = {"cause": cause, "retryable": exc.retryable}
            result = error_result(self.redactor.scrub_text(f"the call failed below the tool ({cause}): {exc.message}"))
        _faults.fault("after_call")
        duration_ms = round((self.clock.monotonic() - started) * 1000, 3)
        wire: Any = self.redactor.scrub(dict(result.wire))
        result = ToolResult(wire, result.extra)
        result_bytes = canonical(wire)
        if budget_mod.result_too_large(self.contract, len(result_bytes)):
            limit = self.contract.budget.max_result_bytes
            result = error_result(f"the result was {len(result_bytes)} bytes, over max_result_bytes ({limit})")
            failure = {"cause": "result_too_large", "retryable": False}
            result_bytes = canonical(dict(result.wire))
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
        if failure is not None:
            body["failure"] = failure
        elif (signal := self._signal_name(tool, result)) is not None:
            return await self._pending_signal(request, body, signal, result_bytes)
        # Durable before dependent: the model sees the result only after it is committed.
        await self.journal.append(Record("mcp_tool_call", body, {result_ref: result_bytes}), durable=True)
        _faults.fault("after_result")
        if failure is not None:
            outcome: Outcome = "failed"
        else:
            outcome = "tool_error" if result.is_error else "ok"
        return CallOutcome(
            request.call,
            tool.name,
            outcome,
            result,
            duration_ms,
            code=failure["cause"] if failure else None,
        )

    def _progress(self, request: CallRequest) -> Any:
        sink = self._on_progress
        if sink is None:
            return None
        session = self.journal.session

        async def report(progress: float, total: float | None, message: str | None) -> None:
            _faults.fault("during_call")  # the server has the request: it reports progress on it
            detail = f"{progress:g}" + (f"/{total:g}" if total else "") + (f" {message}" if message else "")
            sink(
                ProgressEvent(
                    kind="tool_progress",
                    session=session,
                    call=request.call,
                    tool=request.tool,
                    detail=self.redactor.scrub_text(detail)[:200],
                )
            )

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
        await self.journal.append(Record("mcp_tool_denied", body, blobs), durable=True)
        return CallOutcome(request.call, request.tool, "denied", error_result(f"denied ({code}): {reason}"),
                           code=code, reason=reason, limit=limit)  # fmt: skip

    async def _approval(
        self, request: CallRequest, stored_args: dict[str, Any], decision: Any, recorded: RecordedCall | None
    ) -> CallOutcome | None:
        """None when a recorded approval lets the call go on; otherwise the outcome to return."""
        if recorded is not None and recorded.requested is not None:
            self._match(request, stored_args, recorded.requested)
            if recorded.decided is None:
                return CallOutcome(request.call, request.tool, "suspended", error_result("waiting for approval"),
                                   code="approval", reason=decision.reason, replayed=True)  # fmt: skip
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
        return CallOutcome(request.call, request.tool, "suspended", error_result("waiting for approval"),
                           code="approval", reason=decision.reason)  # fmt: skip

    # -- durability: resolved in-doubt calls, signals, memo (docs/durability.md) --

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
        if failure is not None:
            outcome: Outcome = "failed"
        else:
            outcome = "tool_error" if result.is_error else "ok"
        code = failure["cause"] if failure else (str(next(iter(extra))) if extra else None)
        return CallOutcome(request.call, request.tool, outcome, result, duration_ms, code=code)

    def _recorded_payload(self, request: CallRequest, entry: StoredEntry, ref: Any) -> bytes:
        data = self.journal.blob(str(ref))
        if data is None:
            raise ReplayDivergenceError(
                f"call {request.call} of session {self.journal.session}: the payload recorded in entry "
                f"{entry.seq} ({entry.kind}) was erased",
                remedy="A session whose payloads were erased cannot be resumed; start a new run",
                session=self.journal.session,
                seq=entry.seq,
                expected="payload " + str(ref),
                actual="erased",
            )
        return data

    async def _resolved(self, request: CallRequest, tool: MountedTool, recorded: RecordedCall) -> CallOutcome | None:
        """The operator's answer to an in-doubt call (``truss resolve``); None: it was not sent, send it."""
        assert recorded.resolved is not None and recorded.intent is not None
        body: Mapping[str, Any] = recorded.resolved.body
        if body.get("resolution") == "not_sent":
            return None
        data = self._recorded_payload(request, recorded.resolved, body.get("result"))
        failure = {"cause": "in_doubt_failed", "retryable": False} if body.get("resolution") == "failed" else None
        extra = {"resolved": recorded.resolved.seq, "intent": recorded.intent.seq}
        return await self._settle(request, recorded.intent.body, data, extra, failure=failure)

    async def _awaited(self, request: CallRequest, recorded: RecordedCall) -> CallOutcome:
        """A call recorded as pending: its signal's payload once delivered, else it still waits."""
        pending = recorded.pending
        assert pending is not None
        self._match(request, self._stored_args(request), pending)
        body: Mapping[str, Any] = pending.body
        if body.get("kind") == "task":
            return await self._poll_task(request, recorded)
        if recorded.signal is None:
            why = f"waiting for signal {body.get('signal')!r}"
            return CallOutcome(request.call, request.tool, "suspended", error_result(why), code="signal",
                               reason=why, replayed=True)  # fmt: skip
        # Charged when it ran live, in an earlier process: charge again so the resumed state matches.
        await self.charge(lambda state: budget_mod.charge_call(state, self.contract, request.tool, self.clock.now_ms()))
        signal = recorded.signal
        data = self._recorded_payload(request, signal, signal.body.get("result"))
        extra = {"signal": signal.seq, "intent": body.get("intent")}
        return await self._settle(request, body, data, extra, duration_ms=float(max(0, signal.ts - pending.ts)))

    async def _invoke(
        self, request: CallRequest, tool: MountedTool, arguments: dict[str, Any], timeout_s: float, intent: StoredEntry
    ) -> ToolResult | None:
        """Send the call: as an MCP task when the transport runs this tool as one (then ``mcp_tool_pending``
        records the task id before Truss waits), else as a plain call. None: the task still runs."""
        progress = self._progress(request)
        start_task: Any = getattr(self.transport, "start_task", None)
        task_id = await start_task(tool, arguments, timeout_s=timeout_s) if start_task is not None else None
        if task_id is None:
            return await self.transport.call(tool, arguments, timeout_s=timeout_s, progress=progress)
        pending = {k: intent.body[k] for k in ("call", "turn", "tool", "args", "pin")}
        pending.update({"intent": intent.seq, "kind": "task", "task": str(task_id)})
        await self.journal.append(Record("mcp_tool_pending", pending), durable=True)
        _faults.fault("task_pending")
        left = budget_mod.call_timeout_s(self.contract, tool.name, self._budget.state, self.clock.now_ms())
        return await self._task_result(tool, str(task_id), left, progress)

    async def _task_result(self, tool: MountedTool, task_id: str, timeout_s: float, progress: Any) -> ToolResult | None:
        result: ToolResult | None = await cast(Any, self.transport).task_result(
            tool, task_id, timeout_s=timeout_s, progress=progress
        )
        return ToolResult(result.wire, {**result.extra, "task_id": task_id}) if result is not None else None

    def _task_waiting(self, request: CallRequest) -> CallOutcome:
        why = "waiting for a task to finish (truss resume polls it again)"
        return CallOutcome(request.call, request.tool, "suspended", error_result(why), code="task", reason=why)

    async def _poll_task(self, request: CallRequest, recorded: RecordedCall) -> CallOutcome:
        """A call recorded as a pending MCP task: poll the same task; unknown to the server -> in doubt."""
        pending = recorded.pending
        assert pending is not None
        tool = self.tools.get(request.tool)
        if tool is None or getattr(self.transport, "task_result", None) is None:
            raise self._divergence(request, pending, f"{request.tool}, which cannot be polled in this run")
        await self.charge(lambda state: budget_mod.charge_call(state, self.contract, tool.name, self.clock.now_ms()))
        arguments = dict(request.arguments or {})
        stored_args = self.redactor.redact_arguments(tool.server, arguments)
        if recorded.resolved is not None:
            settled = await self._resolved(request, tool, recorded)
            return settled if settled is not None else await self._execute(request, tool, arguments, stored_args)
        timeout_s = budget_mod.call_timeout_s(self.contract, tool.name, self._budget.state, self.clock.now_ms())
        failure: dict[str, Any] | None = None
        try:
            result = await self._task_result(tool, str(pending.body.get("task")), timeout_s, self._progress(request))
        except McpError as exc:
            if exc.fields.get("cause") == "task_unknown":
                server = self.contract.mcp.server(tool.server)
                if server is not None and tool.tool in server.retry_in_doubt:
                    return await self._execute(request, tool, arguments, stored_args)
                await self._in_doubt(request, recorded)
            cause = str(exc.fields.get("cause") or "transport")
            failure = {"cause": cause, "retryable": exc.retryable}
            result = error_result(self.redactor.scrub_text(f"the call failed below the tool ({cause}): {exc.message}"))
        if result is None:
            return self._task_waiting(request)
        data = canonical(self.redactor.scrub(dict(result.wire)))
        if budget_mod.result_too_large(self.contract, len(data)):
            limit = self.contract.budget.max_result_bytes
            refused = error_result(f"the result was {len(data)} bytes, over max_result_bytes ({limit})")
            data = canonical(dict(refused.wire))
            failure = {"cause": "result_too_large", "retryable": False}
        extra = {"task": pending.body.get("task"), "intent": pending.body.get("intent")}
        return await self._settle(request, pending.body, data, extra, failure=failure,
                                  duration_ms=float(max(0, self.clock.now_ms() - pending.ts)))  # fmt: skip

    def _signal_name(self, tool: MountedTool, result: ToolResult) -> str | None:
        """The signal a result waits for, when its server declares the tool async and the result is pending."""
        server = self.contract.mcp.server(tool.server)
        if server is None:
            return None
        for decl in server.async_:
            if decl.tool != tool.tool:
                continue
            document: Any = result.structured
            if document is None:
                try:
                    document = json.loads(result.text)
                except ValueError:
                    return None
            found, value = resolve_pointer(document, decl.pending.pointer)
            if not found or value != decl.pending.equals:
                return None
            found, name = resolve_pointer(document, decl.signal)
            if not found or isinstance(name, dict | list) or name is None:
                return None
            text = name if isinstance(name, str) else json.dumps(name)
            # An untrusted server names the signal: it is shown to the operator, so short and plain.
            return text if 0 < len(text) <= 200 and text.isprintable() else None
        return None

    async def _pending_signal(
        self, request: CallRequest, body: dict[str, Any], signal: str, result_bytes: bytes
    ) -> CallOutcome:
        """Record ``mcp_tool_pending`` for a result that says "later": the run suspends until ``truss signal``."""
        pending = {k: body[k] for k in ("call", "turn", "tool", "args", "pin", "intent", "result")}
        pending.update({"kind": "signal", "signal": signal})
        await self.journal.append(Record("mcp_tool_pending", pending, {body["result"]: result_bytes}), durable=True)
        why = f"waiting for signal {signal!r}"
        return CallOutcome(request.call, request.tool, "suspended", error_result(why), code="signal", reason=why)

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
            charged = await self.charge(
                lambda state: budget_mod.charge_call(state, self.contract, tool.name, self.clock.now_ms())
            )
            if not isinstance(charged, Charged):
                exceeded: Any = charged
                why = f"budget exhausted: {exceeded.detail}"
                return await self._deny(request, stored_args, code="budget", reason=why, limit=str(exceeded.limit))
        data = self._recorded_payload(request, hit, hit.body.get("result"))
        origin = {"session": hit.session, "seq": hit.seq, "hash": hit.hash}
        return await self._settle(request, {"args": hit.body.get("args"), "pin": tool.pin}, data,
                                  {"replayed_from": origin})  # fmt: skip

    def _replayed_denial(self, request: CallRequest, entry: StoredEntry) -> CallOutcome:
        self._match(request, self._stored_args(request), entry)
        body: Mapping[str, Any] = entry.body
        code, reason = str(body.get("code")), str(body.get("reason"))
        limit: Any = body.get("limit")
        return CallOutcome(request.call, request.tool, "denied", error_result(f"denied ({code}): {reason}"),
                           code=code, reason=reason, replayed=True, limit=limit)  # fmt: skip

    async def _replayed_result(self, request: CallRequest, entry: StoredEntry) -> CallOutcome:
        self._match(request, self._stored_args(request), entry)
        body: Mapping[str, Any] = entry.body
        data = self.journal.blob(str(body["result"]))
        if data is None:
            raise ReplayDivergenceError(
                f"call {request.call} of session {self.journal.session} was recorded, but its result was erased",
                remedy="A session whose payloads were erased cannot be resumed; start a new run",
                session=self.journal.session,
                seq=entry.seq,
                expected="result payload",
                actual="erased",
            )
        # The call was charged when it ran; charge it again so the resumed state matches. The
        # recorded outcome stands even if live charging order would now differ.
        tool = str(body.get("tool"))
        if "replayed_from" not in body or self.contract.budget.charge_memo_hits:
            await self.charge(lambda state: budget_mod.charge_call(state, self.contract, tool, self.clock.now_ms()))
        wire: Any = json.loads(data)
        failure = _as_dict(body.get("failure"))
        if failure is not None:
            outcome: Outcome = "failed"
            code: str | None = str(failure.get("cause"))
        else:
            outcome = "tool_error" if body.get("is_error") else "ok"
            code = None
        return CallOutcome(request.call, request.tool, outcome, ToolResult(wire), float(body.get("duration_ms", 0)),
                           code=code, replayed=True)  # fmt: skip

    async def _in_doubt(self, request: CallRequest, recorded: RecordedCall) -> None:
        if recorded.in_doubt is None:
            await self.journal.append(
                Record(
                    "in_doubt",
                    {
                        "call": request.call,
                        "tool": request.tool,
                        "intent": recorded.intent.seq if recorded.intent else None,
                    },
                ),
                durable=True,
            )
        raise InDoubtError(
            f"call {request.call} ({request.tool}) of session {self.journal.session} was sent but its result "
            "was never recorded, and the tool is not declared safe to re-send",
            remedy=f"Find out whether it happened, then run 'truss resolve {self.journal.session} {request.call}' "
            "with --result JSON, --failed or --not-sent, and resume",
            session=self.journal.session,
            call=request.call,
            tool=request.tool,
            reason="in_doubt",
        )

    def _match(self, request: CallRequest, stored_args: dict[str, Any] | None, entry: StoredEntry) -> None:
        body: Mapping[str, Any] = entry.body
        args_ref = sha256_ref(canonical(stored_args)) if stored_args is not None else None
        if body.get("tool") != request.tool or body.get("args") != args_ref:
            raise self._divergence(request, entry, f"{request.tool} with arguments {args_ref}")

    def _divergence(self, request: CallRequest, entry: StoredEntry | None, actual: str) -> ReplayDivergenceError:
        body: Mapping[str, Any] = entry.body if entry is not None else {}
        expected = f"{entry.kind if entry else '?'} {body.get('tool')} with arguments {body.get('args')}"
        return ReplayDivergenceError(
            f"resumed session {self.journal.session} asked for {actual} as call {request.call}, "
            f"but the ledger recorded {expected}",
            remedy="The run no longer matches its record; nothing was called. Start a new run",
            session=self.journal.session,
            seq=entry.seq if entry else None,
            expected=expected,
            actual=actual,
        )


def server_of(tool: str) -> str | None:
    parts = split_namespaced(tool)
    return parts[0] if parts else None
