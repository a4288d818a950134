"""What an operator or an auditor does to a session between runs: resolve, signal, replay.

- ``resolve_call``: the operator's answer to an in-doubt call (an intent whose result was never
  recorded, for a tool not declared safe to re-send): the result it had, that it failed, or that
  it was never sent. Appends ``in_doubt_resolved``; the next ``truss resume`` records the answer as
  the call's ``mcp_tool_call`` (or, for ``not_sent``, sends the call).
- ``deliver_signal``: the payload an outside system sends for a call that answered "pending"
  (the signal pattern, ``[[mcp.servers.async]]``). Appends ``signal_received``; resume records the
  payload as the call's result.
- ``replay_session``: re-derives a finished session from its ledger alone, with no server and no
  model: the loop is driven with a provider that only has the recorded turns and a transport that
  refuses every call, so each recorded step must follow from the steps before it; a panel's
  reviewers are asked through reviewers that refuse, so each recorded review's request must follow
  from the record too; then the verdict is recomputed and compared with the recorded one.

Resume itself is ``truss.session.resume_session``; the gate (``truss.gate``) turns these entries
into results. This module never imports the MCP SDK and reads no clock: replay runs on a clock
frozen at the session's first entry (a deadline cannot be re-derived offline; see ``replay_session``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from truss._errors import (
    InputError,
    McpError,
    NotFoundError,
    ProviderError,
    ReplayDivergenceError,
    TrussError,
    UsageError,
)
from truss.budget import BudgetState
from truss.contract import Contract, ProviderCapabilities, render_intent
from truss.gate import Gate, Journal, Redactor
from truss.ledger.canonical import CanonicalError, canonical, sha256_ref
from truss.ledger.entry import Record, StoredEntry
from truss.ledger.stores.base import LedgerStore, SessionInfo, StoredCheckpoint
from truss.loop import run_loop
from truss.panel import run_panels
from truss.providers.base import TurnRequest, TurnResponse
from truss.runtime import Runtime
from truss.tools import MountedTool, ProgressFn, ToolResult, error_result, split_namespaced
from truss.turns import rebuild_request
from truss.verdict import RunError, evaluate

__all__ = [
    "ReplayReport",
    "deliver_signal",
    "in_doubt_calls",
    "parse_payload",
    "replay_session",
    "resolve_call",
]

MAX_REASON_CHARS = 2000
TERMINAL = frozenset({"pass", "fail", "error"})


# -- payloads given by an operator ------------------------------------------------------------------


def parse_payload(text: str, *, what: str) -> Any:
    """The JSON value an operator gave (``--result``/``--payload``); ``UsageError`` when it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{what} is not JSON ({exc.msg} at position {exc.pos})",
            remedy='Give a JSON value, e.g. \'{"content": [{"type": "text", "text": "done"}]}\' or \'"done"\'',
        ) from None


def as_tool_result(value: Any) -> ToolResult:
    """An operator's JSON as a tool result.

    An object with a ``content`` list is taken as a tool result (``content``, ``structuredContent``,
    ``isError``; other members are dropped). A string becomes one text block. Anything else becomes
    structured content with its compact JSON as the text.
    """
    if isinstance(value, dict) and isinstance(cast(dict[str, Any], value).get("content"), list):
        given = cast(dict[str, Any], value)
        wire: dict[str, Any] = {"content": given["content"], "isError": given.get("isError") is True}
        if "structuredContent" in given:
            wire["structuredContent"] = given["structuredContent"]
        return ToolResult(wire)
    if isinstance(value, str):
        return ToolResult({"content": [{"type": "text", "text": value}], "isError": False})
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    wire = {"content": [{"type": "text", "text": text}], "isError": False}
    if isinstance(value, dict):
        wire["structuredContent"] = value
    return ToolResult(wire)


def _result_blob(result: ToolResult, contract: Contract, environ: Mapping[str, str], what: str) -> bytes:
    wire: Any = Redactor(contract, environ).scrub(dict(result.wire))
    try:
        data = canonical(wire)
    except CanonicalError as exc:
        raise UsageError(
            f"{what} cannot be recorded: {exc}", remedy="Give plain JSON (no huge or odd numbers)"
        ) from None
    limit = contract.budget.max_result_bytes
    if len(data) > limit:
        raise UsageError(
            f"{what} is {len(data)} bytes, over the contract's max_result_bytes ({limit})",
            remedy="Give a shorter result",
        )
    return data


# -- resolve ------------------------------------------------------------------------------------------


def in_doubt_calls(entries: list[StoredEntry]) -> dict[str, StoredEntry]:
    """Call id -> its ``in_doubt`` entry, for each in-doubt call not yet resolved or settled."""
    resolved = {str(e.body.get("call")) for e in entries if e.kind == "in_doubt_resolved"}
    settled = {str(e.body.get("call")) for e in entries if e.kind == "mcp_tool_call"}
    return {
        str(e.body.get("call")): e
        for e in entries
        if e.kind == "in_doubt" and str(e.body.get("call")) not in resolved | settled
    }


def resolve_call(
    runtime: Runtime,
    session: str,
    call: str,
    *,
    result: Any = None,
    failed: str | None = None,
    not_sent: bool = False,
    by: str | None = None,
) -> StoredEntry:
    """Record the operator's answer for an in-doubt call (``in_doubt_resolved``); exactly one of
    ``result`` (a JSON value, see ``as_tool_result``), ``failed`` (a reason) or ``not_sent``.
    Secret values of ``runtime.environ`` are redacted from a given result before it is recorded."""
    store = runtime.store
    given = [result is not None, failed is not None, not_sent]
    if sum(given) != 1:
        raise UsageError("give exactly one of --result JSON, --failed REASON or --not-sent",
                         remedy="See 'truss resolve --help'")  # fmt: skip
    entries = _entries(store, session)
    waiting = in_doubt_calls(entries)
    doubt = waiting.get(call)
    if doubt is None:
        raise NotFoundError(
            f"session {session} has no unresolved in-doubt call {call!r}",
            remedy=f"In-doubt calls: {', '.join(waiting) or 'none'}",
            what="call",
            name=call,
        )
    contract = recorded_contract(session, entries[0].body)
    body: dict[str, Any] = {"call": call, "tool": doubt.body.get("tool"), "in_doubt": doubt.seq}
    blobs: dict[str, bytes] = {}
    if not_sent:
        body["resolution"] = "not_sent"
    else:
        if failed is not None:
            if not failed.strip() or len(failed) > MAX_REASON_CHARS:
                raise UsageError(
                    f"--failed needs a reason of 1-{MAX_REASON_CHARS} characters", remedy="Say what failed"
                )
            tool_result = error_result(f"the operator resolved this in-doubt call as failed: {failed}")
            body["resolution"] = "failed"
        else:
            tool_result = as_tool_result(result)
            body["resolution"] = "result"
        data = _result_blob(tool_result, contract, runtime.environ, "the result")
        ref = sha256_ref(data)
        body["result"] = ref
        body["is_error"] = tool_result.is_error
        blobs[ref] = data
    if by:
        body["by"] = by
    [entry] = store.append(session, [Record("in_doubt_resolved", body, blobs)], durable=True,
                           expect_seq=entries[-1].seq + 1)  # fmt: skip
    return entry


# -- signal -------------------------------------------------------------------------------------------


def deliver_signal(runtime: Runtime, session: str, name: str, payload: Any) -> StoredEntry:
    """Record ``payload`` as the result of the call waiting for signal ``name`` (``signal_received``)."""
    store = runtime.store
    entries = _entries(store, session)
    received = {str(e.body.get("call")) for e in entries if e.kind in ("signal_received", "mcp_tool_call")}
    waiting = {
        str(e.body.get("signal")): e
        for e in entries
        if e.kind == "mcp_tool_pending" and e.body.get("kind") == "signal" and str(e.body.get("call")) not in received
    }
    pending = waiting.get(name)
    if pending is None:
        raise NotFoundError(
            f"session {session} has no call waiting for signal {name!r}",
            remedy=f"Signals awaited: {', '.join(map(repr, waiting)) or 'none'}",
            what="signal",
            name=name,
        )
    contract = recorded_contract(session, entries[0].body)
    tool_result = as_tool_result(payload)
    data = _result_blob(tool_result, contract, runtime.environ, "the payload")
    ref = sha256_ref(data)
    body = {
        "call": pending.body.get("call"),
        "signal": name,
        "pending": pending.seq,
        "result": ref,
        "is_error": tool_result.is_error,
    }
    [entry] = store.append(session, [Record("signal_received", body, {ref: data})], durable=True,
                           expect_seq=entries[-1].seq + 1)  # fmt: skip
    return entry


# -- replay -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayReport:
    """What ``truss replay`` found. ``matches``: the recomputed verdict equals the recorded one."""

    session: str
    recorded: dict[str, Any]
    replayed: dict[str, Any] | None
    matches: bool
    turns: int
    calls: int
    reason: str | None = None
    reviews: int = 0  # panel_review entries: each reviewer's recorded answer

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "matches": self.matches,
            "recorded": self.recorded,
            "replayed": self.replayed,
            "turns": self.turns,
            "calls": self.calls,
            "reviews": self.reviews,
            "reason": self.reason,
        }


class _FrozenClock:
    """Replay's clock: always the session's first instant, so no recorded duration can run out."""

    def __init__(self, ms: int) -> None:
        self._ms = ms

    def now_ms(self) -> int:
        return self._ms

    def monotonic(self) -> float:
        return self._ms / 1000.0

    def new_id(self, prefix: str) -> str:
        raise ReplayDivergenceError("replay asked for a fresh id", expected="the record", actual="a new id")


class _RecordOnlyProvider:
    """A model that knows nothing: every turn must come from the record."""

    name = "replay"
    capabilities = ProviderCapabilities(needs_model=False)

    def __init__(self) -> None:
        self.asked: int | None = None

    async def next_turn(self, request: TurnRequest) -> TurnResponse:
        self.asked = request.turn
        raise ProviderError(f"model turn {request.turn} is not in the record", provider="replay")

    async def aclose(self) -> None:
        return None


class _RecordOnlyReviewer:
    """A reviewer that knows nothing: every review must come from the record."""

    name = "replay"
    capabilities = ProviderCapabilities(needs_model=False)

    def __init__(self, check: int, reviewer: int) -> None:
        self._where = f"reviewer {reviewer} of done check {check}"

    async def next_turn(self, request: TurnRequest) -> TurnResponse:
        raise ReplayDivergenceError(
            f"replay needed a live answer from {self._where}: the record has no review by it",
            expected="a recorded panel_review",
            actual=f"a live review by {self._where}",
        )

    async def aclose(self) -> None:
        return None


class _NoServers:
    """A transport that refuses: replay never reaches a server."""

    async def call(
        self, tool: MountedTool, arguments: Mapping[str, Any], *, timeout_s: float, progress: ProgressFn | None = None
    ) -> ToolResult:
        raise ReplayDivergenceError(
            f"replay needed a live call of {tool.name}: the record has no result for it",
            expected="a recorded result",
            actual=f"a live call of {tool.name}",
        )


class _ReadOnlyStore:
    """The store as replay sees it: reads pass through; any write means the record was incomplete."""

    def __init__(self, store: LedgerStore) -> None:
        self._store = store
        self.origin = store.origin

    def _refuse(self, what: str, session: str | None = None) -> ReplayDivergenceError:
        return ReplayDivergenceError(
            f"replaying session {session or '-'} needed a step the record does not hold ({what})",
            expected="a recorded step",
            actual=f"a new {what}",
            session=session,
        )

    def append(
        self,
        session: str,
        records: Sequence[Record],
        *,
        durable: bool = True,
        expect_seq: int | None = None,
        epoch: int | None = None,
    ) -> list[StoredEntry]:
        raise self._refuse(", ".join(r.kind for r in records) + " entry", session)

    def erase_payloads(self, session: str) -> int:
        raise self._refuse("erasure", session)

    def add_checkpoint(self, size: int, root: bytes, note: str) -> None:
        raise self._refuse("checkpoint")

    def set_envelope(self, session: str, envelope: bytes) -> None:
        raise self._refuse("verdict envelope", session)

    def session(self, session: str) -> SessionInfo | None:
        return self._store.session(session)

    def sessions(
        self, *, status: str | None = None, limit: int | None = None, principal: Any = None
    ) -> list[SessionInfo]:
        return self._store.sessions(status=status, limit=limit, principal=principal)

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterator[StoredEntry]:
        return self._store.read_session(session, from_seq=from_seq)

    def read_range(self, start: int, stop: int) -> Iterator[StoredEntry]:
        return self._store.read_range(start, stop)

    def blob(self, ref: str) -> bytes | None:
        return self._store.blob(ref)

    def blobs_for(self, refs: Iterable[str]) -> dict[str, bytes]:
        return self._store.blobs_for(refs)

    def erased_refs(self, session: str) -> set[str]:
        return self._store.erased_refs(session)

    def tree_size(self) -> int:
        return self._store.tree_size()

    def tree_root(self) -> bytes:
        return self._store.tree_root()

    def tree_head(self) -> tuple[int, bytes]:
        return self._store.tree_head()

    def node(self, level: int, index: int) -> bytes:
        return self._store.node(level, index)

    def nodes(self, keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        return self._store.nodes(keys)

    def node_hashes(self, keys: Iterable[tuple[int, int]]) -> Iterator[bytes]:
        return self._store.node_hashes(keys)

    def checkpoints(self) -> list[StoredCheckpoint]:
        return self._store.checkpoints()

    def latest_checkpoint(self) -> StoredCheckpoint | None:
        return self._store.latest_checkpoint()

    def checkpoint_covering(self, size: int) -> StoredCheckpoint | None:
        return self._store.checkpoint_covering(size)

    def envelope(self, session: str) -> bytes | None:
        return self._store.envelope(session)

    def close(self) -> None:
        return None


async def replay_session(runtime: Runtime, session: str) -> ReplayReport:
    """Re-derive finished ``session`` from its ledger alone and compare verdicts (module docstring).

    Only ``runtime.store`` is used: no server, no model, no key, no clock. Raises ``NotFoundError``
    for an unknown session and ``UsageError`` for one without a verdict. A record that does not
    follow from itself is reported (``matches`` False, ``reason``), not raised.
    """
    store = runtime.store
    entries = _entries(store, session)
    verdict_at = next((i for i in range(len(entries) - 1, -1, -1) if entries[i].kind == "verdict"), None)
    if verdict_at is None:
        raise UsageError(
            f"session {session} has no verdict yet: replay re-derives finished sessions",
            remedy=f"Finish it first ('truss resume {session}'), or look at it with 'truss ledger show {session}'",
        )
    recorded_verdict = dict(entries[verdict_at].body)
    before = entries[:verdict_at]
    started = entries[0].body
    turns = sum(1 for e in before if e.kind == "model_turn")
    calls = sum(1 for e in before if e.kind in ("mcp_tool_call", "mcp_tool_denied"))
    reviews = sum(1 for e in before if e.kind == "panel_review")
    try:
        contract = recorded_contract(session, started)
        replayed = await _rederive(store, session, contract, before, recorded_verdict)
    except TrussError as exc:
        return ReplayReport(session, recorded_verdict, None, False, turns, calls, exc.message, reviews)
    matches = canonical(replayed) == canonical(recorded_verdict)
    reason = None if matches else _difference(recorded_verdict, replayed)
    return ReplayReport(session, recorded_verdict, replayed, matches, turns, calls, reason, reviews)


async def _rederive(
    store: LedgerStore, session: str, contract: Contract, before: list[StoredEntry], recorded: Mapping[str, Any]
) -> dict[str, Any]:
    started = before[0].body
    failure: Any = started.get("start_failure")
    if isinstance(failure, dict):
        kind = str(cast(dict[str, Any], failure).get("kind"))
        mcp_kinds = {McpError.kind, "server_start", "tool_not_advertised", "pin_mismatch", "tool_call"}
        error = RunError("server" if kind in mcp_kinds else "input", str(cast(dict[str, Any], failure).get("message")))
        verdict = evaluate(contract, before, store.blob, final_text=None, error=error)
    else:
        clock = _FrozenClock(before[0].ts)
        journal = Journal(_ReadOnlyStore(store), session, recorded=before)
        tools = _recorded_tools(session, contract, started, before, store)
        redactor = Redactor(contract, {})
        gate = Gate(contract=contract, journal=journal, transport=_NoServers(), tools=tools, clock=clock,
                    budget=BudgetState.start(clock.now_ms()), redactor=redactor)  # fmt: skip
        provider = _RecordOnlyProvider()
        try:
            intent = render_intent(contract, {})
        except InputError:
            # An intent built from ${env.X} cannot be rebuilt offline: take it from the recorded first request.
            intent = _recorded_intent(before, store)
        result = await run_loop(contract=contract, gate=gate, provider=provider, clock=clock, intent=intent,
                                redactor=redactor)  # fmt: skip
        error: RunError | None = None
        if result.stop == "provider_error" and provider.asked is not None:
            # The record ends before the run does: only a cause outside the record (the deadline, a
            # provider failure) could have stopped it here. Take that cause from the recorded verdict.
            cause: Any = recorded.get("error")
            if not isinstance(cause, dict) or cast(dict[str, Any], cause).get("cause") not in ("deadline", "provider"):
                raise ReplayDivergenceError(
                    f"the record of session {session} ends at model turn {provider.asked}, but nothing recorded "
                    "stopped the run there",
                    expected="a recorded turn or a recorded deadline/provider error",
                    actual=f"no model turn {provider.asked}",
                )
            given = cast(dict[str, Any], cause)
            error = RunError(str(given["cause"]), str(given.get("detail")), given.get("limit"))
        elif result.stop == "budget":
            error = RunError("budget", result.reason or "a budget ran out", result.limit)
        elif result.stop == "suspended":
            raise ReplayDivergenceError(
                f"replaying session {session} stopped at calls still waiting: {', '.join(result.waiting)}",
                expected="a settled call", actual="a call still waiting",
            )  # fmt: skip
        elif result.stop == "done":
            await run_panels(contract=contract, journal=journal, gate=gate, clock=clock, intent=intent,
                             redactor=redactor, reviewers=_RecordOnlyReviewer)  # fmt: skip
        verdict = evaluate(contract, before, store.blob, final_text=result.final_text, error=error)
    body = verdict.to_json()
    body["contract_hash"] = contract.hash
    return body


def _recorded_tools(
    session: str, contract: Contract, started: Mapping[str, Any], before: list[StoredEntry], store: LedgerStore
) -> dict[str, MountedTool]:
    """The mounted tools as the model saw them: names and pins from ``session_started``, descriptions and
    schemas from the first recorded model request."""
    pins: Mapping[str, Any] = started.get("pins") or {}
    specs: dict[str, Mapping[str, Any]] = {}
    first = next((e for e in before if e.kind == "model_turn"), None)
    if first is not None:
        request = rebuild_request(str(first.body.get("request")), store.blob)
        if request is None:
            raise ReplayDivergenceError(
                f"session {session}: the payload of model turn 1 was erased, so the tools it offered are unknown",
                session=session, seq=first.seq, expected="request payload", actual="erased",
            )  # fmt: skip
        offered: Any = request.get("tools")
        for item in cast(list[Any], offered) if isinstance(offered, list) else []:
            if isinstance(item, dict):
                spec = cast(dict[str, Any], item)
                specs[str(spec.get("name"))] = spec
    tools: dict[str, MountedTool] = {}
    for name, pin in pins.items():
        parts = split_namespaced(str(name))
        if parts is None or contract.mcp.server(parts[0]) is None:
            continue
        probe = MountedTool(parts[0], parts[1], {"name": parts[1]}, str(pin))
        spec = specs.get(probe.provider_name, {})
        definition: dict[str, Any] = {"name": parts[1], "description": spec.get("description", "")}
        definition["inputSchema"] = spec.get("input_schema", {"type": "object"})
        tools[str(name)] = MountedTool(parts[0], parts[1], definition, str(pin))
    return tools


def _recorded_intent(before: list[StoredEntry], store: LedgerStore) -> str:
    first = next((e for e in before if e.kind == "model_turn"), None)
    request = rebuild_request(str(first.body.get("request")), store.blob) if first is not None else None
    messages: Any = request.get("messages") if request is not None else None
    opening: Any = cast(list[Any], messages)[0] if isinstance(messages, list) and messages else None
    if not isinstance(opening, dict) or not isinstance(cast(dict[str, Any], opening).get("text"), str):
        raise ReplayDivergenceError("the intent cannot be rebuilt offline and the first request is not stored",
                                    expected="request payload", actual="absent")  # fmt: skip
    return str(cast(dict[str, Any], opening)["text"])


def _difference(recorded: Mapping[str, Any], replayed: Mapping[str, Any]) -> str:
    if recorded.get("status") != replayed.get("status"):
        return f"the record says {recorded.get('status')}, replay reaches {replayed.get('status')}"
    for key in sorted(set(recorded) | set(replayed)):
        if canonical(recorded.get(key)) != canonical(replayed.get(key)):
            return f"the verdicts differ in {key!r}"
    return "the verdicts differ"


# -- shared -------------------------------------------------------------------------------------------


def _entries(store: LedgerStore, session: str) -> list[StoredEntry]:
    if store.session(session) is None:
        raise NotFoundError(f"no session {session!r} in this ledger", what="session", name=session,
                            remedy="List sessions with 'truss sessions'")  # fmt: skip
    return list(store.read_session(session))


def recorded_contract(session: str, started: Mapping[str, Any]) -> Contract:
    """The effective contract a session recorded at its start, checked against its recorded hash."""
    from pydantic import ValidationError

    try:
        contract = Contract.model_validate(started.get("effective"))
    except ValidationError as exc:
        raise ReplayDivergenceError(
            f"session {session}: the recorded effective contract cannot be loaded by this version of Truss",
            remedy="Use the Truss version that started the run",
            session=session, expected="a loadable contract", actual=f"{exc.error_count()} validation error(s)",
        ) from None  # fmt: skip
    if contract.hash != started.get("contract_hash"):
        raise ReplayDivergenceError(
            f"session {session}: the recorded effective contract does not hash to the recorded contract hash",
            remedy="Verify the ledger with 'truss ledger verify'",
            session=session, expected=str(started.get("contract_hash")), actual=contract.hash,
        )  # fmt: skip
    return contract
