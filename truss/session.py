"""Sessions: start a run, record every step, end it with a signed verdict; suspend and resume for approvals.

``run_contract`` is the one entry point that runs a contract (``truss run`` and serve-mcp call it):

1. a session id (``clock.new_id("s")`` or the caller's; a caller's id that already exists returns
   that session's outcome instead of running again, so a repeated request never runs twice);
2. connect the contract's servers through the ``connector`` it is given (``truss.mcp.client.connect``
   in production: this module never imports the MCP SDK), called as ``connector(contract,
   log_dir=, environ=, clock=, on_event=)`` (``on_event(server, name, attributes)`` turns what
   launchers and auth flows report into the run's ``ServerEvent``s); record ``session_started``
   (contract name, hash and effective JSON, pins, servers' protocol versions, info and how each
   was reached, principal, truss version). A server that cannot start still gets a session:
   ``session_started`` with the failure, then an ``error`` verdict, so every attempt is on the record;
3. drive the loop (``truss.loop``) through the gate (``truss.gate``); with the final answer, ask the
   reviewers of the contract's ``panel`` checks (``truss.panel``; built when the run starts, so a
   reviewer's missing API key stops it before anything is called), each answer a ``panel_review``;
4. end: ``verdict`` {status, checks, contract_hash, reason}, ``session_ended``, a signed
   checkpoint, and the DSSE verdict envelope (in-toto Statement v1 whose subject digest is the
   ``session_ended`` entry hash) stored beside the chain; then, when the home configures
   witnesses, the checkpoint goes to them (``truss.witness.submit``, bounded, never failing the run).

A run that must wait (a call needs approval; a call is in doubt) records ``session_suspended``
and returns ``suspended`` (exit 3). A stop request (Ctrl-C, SIGTERM: the ``stop`` event) cancels
the run; the writes in flight complete (the journal never abandons a write), servers shut down as
the connector exits, and ``session_suspended`` {reason: interrupted} is recorded (exit 3,
resumable). ``approve_call`` records a person's decision; ``resume_session`` re-drives a
suspended session from its recorded effective contract: recorded model turns and tool results are
returned from the ledger (``Journal``), never re-requested, and the first unrecorded step goes
live. A resumed run that asks for something else stops with ``ReplayDivergenceError``.

Every step is one ``Journal.append``; what a step recorded is found again by its turn number or
call id, so a later, more general resume (in-doubt resolution, replay without servers) can build
on the same index.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import re
from collections.abc import AsyncGenerator, Callable, Generator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import anyio
from anyio.abc import TaskGroup

from truss import _faults
from truss._clock import Clock
from truss._collector import ReplayCollections
from truss._errors import (
    InDoubtError,
    InputError,
    LoginRequiredError,
    McpError,
    NotFoundError,
    ReplayDivergenceError,
    RunSuspended,
    SandboxError,
    StoreConflictError,
    TrussError,
    UsageError,
)
from truss._quota_book import reserve as quota_reserve
from truss._quota_book import settle as quota_settle
from truss._version import __version__
from truss.budget import BudgetState
from truss.contract import Contract, render_intent, uses_panel
from truss.events import EventBus, RunEvents
from truss.gate import Gate, Journal, Redactor
from truss.ledger.canonical import canonical
from truss.ledger.entry import Record, StoredEntry
from truss.ledger.envelope import sign_verdict, verdict_statement
from truss.ledger.keyhistory import is_log_session
from truss.ledger.keys import IdentityKey
from truss.ledger.reader import VerifiedStore, unverified
from truss.ledger.stores.base import Lease, LedgerStore, SessionInfo
from truss.ledger.workers import end_checkpoint
from truss.loop import LoopResult, run_loop
from truss.panel import ReviewerSet, open_reviewers, run_panels
from truss.providers.base import Provider
from truss.quota import UsageTally, quotas_of
from truss.runtime import Connector, ProviderFactory, Runtime
from truss.tools import MountedTool, ToolTransport
from truss.verdict import RunError, Verdict, VerdictFold

__all__ = [
    "TERMINAL",
    "Connector",
    "MountSet",
    "ProviderFactory",
    "RunOutcome",
    "approve_call",
    "check_session_id",
    "outcome_of",
    "pending_approvals",
    "pending_signals",
    "resume_session",
    "run_contract",
]

SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
TERMINAL = frozenset({"pass", "fail", "error"})
EXIT_CODES = {"pass": 0, "fail": 1, "error": 4, "suspended": 3, "interrupted": 3, "diverged": 4, "running": 3}
_STOPPED_WHILE_READING = "stopped while the session was read and verified; nothing was recorded"
RECORDED_SERVER_EVENTS = frozenset({"sandbox_egress"})
"""What launchers report that also becomes a signed entry of that kind (docs/ledger-format.md)."""


class MountSet(ToolTransport, Protocol):
    """What a connector yields: the mounted tools, their pins and the servers' identities."""

    @property
    def tools(self) -> Mapping[str, MountedTool]: ...

    @property
    def servers(self) -> Mapping[str, Any]: ...

    def pins(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class RunOutcome:
    """How a run (or a request for an existing session) ended.

    ``status``: pass | fail | error | suspended | interrupted | diverged. ``head`` is the hex hash
    of the session's last entry; ``checkpoint`` the signed checkpoint note (text) that anchors it.
    """

    session: str
    status: str
    verdict: dict[str, Any] | None
    head: str | None
    checkpoint: str | None
    exit_code: int
    reason: str | None
    waiting: tuple[str, ...] = ()
    waiting_on: str | None = None  # what a suspended run waits for: approval, in_doubt, signal, interrupted

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "status": self.status,
            "verdict": self.verdict,
            "head": self.head,
            "checkpoint": self.checkpoint,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "waiting": list(self.waiting),
            "waiting_on": self.waiting_on,
        }


# -- public entry points ----------------------------------------------------------------------------


async def run_contract(
    runtime: Runtime,
    contract: Contract,
    *,
    session_id: str | None = None,
    principal: dict[str, Any] | None = None,
    stop: anyio.Event | None = None,
) -> RunOutcome:
    """Run ``contract`` as a new session and return its outcome (see the module docstring).

    ``runtime`` gives the store, key, clock, home, environment, connector, provider and the
    subscribers to the run's events (``truss.events``); ``stop`` set by the caller (Ctrl-C, a
    server shutting down) interrupts the run, which records itself as ``interrupted`` and stays
    resumable.
    """
    store = runtime.store
    if session_id is not None:
        check_session_id(session_id)
        if store.session(session_id) is not None:
            return outcome_of(store, session_id)
    session = session_id or runtime.clock.new_id("s")
    if quotas_of(contract):
        # Before anything starts: a run that does not fit a quota is refused with nothing but the
        # refusal's settlements on record (QuotaExceededError, exit 6).
        now = runtime.clock.now_ms()
        await anyio.to_thread.run_sync(
            lambda: quota_reserve(store, contract, session=session, principal=principal, now_ms=now)
        )
    journal = _journal(store, session, contract)
    run = _Run(runtime, contract, journal, stop)
    return await run.drive(principal=principal, resumed_from=None)


async def resume_session(runtime: Runtime, session: str, *, stop: anyio.Event | None = None) -> RunOutcome:
    """Continue a suspended or interrupted session from its record (see the module docstring).

    The session is read (and verified) once, whole, before anything is replayed or recorded. Its
    servers start while that read goes on, once the batch holding ``session_started`` has proven
    (``_EarlyServers``); a resume refused after the read stops them again with nothing said. A
    ``stop`` set before the read is in ends the resume there, with nothing recorded: the outcome is
    ``interrupted`` (exit 3) with no checkpoint, and the session is as resumable as it was.
    """
    with ReplayCollections() as held:  # the replay kept out of full collections (truss._collector)
        return await _resume(runtime, session, stop, held)


async def _resume(runtime: Runtime, session: str, stop: anyio.Event | None, held: ReplayCollections) -> RunOutcome:
    store = runtime.store
    listed = None if is_log_session(session) else unverified(store).session(session)  # the log's own is no run
    if listed is not None and not (listed.ended or listed.status in TERMINAL):
        # What the store lists decides only the order of the reads (and whether the servers may
        # start before the read ends): a session to resume is read (and verified) once, whole, and
        # its facts below come from that same read.
        if not _waits_for_a_person(store, listed):
            return await _resume_overlapped(runtime, session, stop, held)
        return await _resume_read(runtime, session, await _read_whole(store, session), stop, held=held)
    info = None if listed is None else store.session(session)
    if info is None:
        raise NotFoundError(f"no session {session!r} in this ledger", what="session", name=session,
                            remedy="List sessions with 'truss sessions'")  # fmt: skip
    if info.status in TERMINAL or info.ended:
        return outcome_of(store, session)
    return await _resume_read(runtime, session, await _read_whole(store, session), stop, held=held)


async def _read_whole(store: LedgerStore, session: str) -> list[StoredEntry]:
    """The session's verified read (R1) in a worker thread: a stop request that comes while a long
    session is read is seen once the read is in (``_resume_read``), not after the run has begun."""
    return await anyio.to_thread.run_sync(lambda: list(store.read_session(session)))


async def _resume_read(
    runtime: Runtime,
    session: str,
    entries: list[StoredEntry],
    stop: anyio.Event | None,
    *,
    contract: Contract | None = None,
    owned: _Owned | None = None,
    connector: Connector | None = None,
    held: ReplayCollections | None = None,
) -> RunOutcome:
    """The resume once its whole verified read is in: the refusals, then the run (its lease and
    servers already taken when given)."""
    store = runtime.store
    info = store.session(session)  # derived from the read just done (R2), not verified again
    if info is None:
        raise NotFoundError(f"no session {session!r} in this ledger", what="session", name=session,
                            remedy="List sessions with 'truss sessions'")  # fmt: skip
    if info.status in TERMINAL or info.ended:
        return outcome_of(store, session)
    if stop is not None and stop.is_set():
        # Stopped while the session was read: the resume has recorded nothing and records nothing
        # (no checkpoint either); the session stays as resumable as it was.
        return RunOutcome(session, "interrupted", None, info.head, None, 3, _STOPPED_WHILE_READING, (), "interrupted")
    # Both refusals read only a few kinds of entry: one pass over the session finds those first.
    asks = [e for e in entries if e.entry["kind"] in _WAITING_KINDS]
    waiting = pending_approvals(asks)
    if waiting:
        raise RunSuspended(
            f"session {session} still waits for approval of call(s) {', '.join(waiting)}",
            remedy=f"Decide with 'truss approve {session} CALL' (or --deny), then resume",
            session=session,
            reason="approval",
            call=waiting[0],
        )
    signals = pending_signals(asks)
    if signals:
        raise RunSuspended(
            f"session {session} still waits for signal(s) {', '.join(repr(n) for n in signals.values())}",
            remedy=f"Deliver one with 'truss signal {session} NAME --payload JSON', then resume",
            session=session,
            reason="signal",
            call=next(iter(signals)),
        )
    started = entries[0].body
    contract = contract or _recorded_contract(session, started)
    # The entries are the verified read of the whole session (R1), so the journal does not re-check their links.
    journal = _journal(store, session, contract, recorded=entries, chained=isinstance(store, VerifiedStore))
    del entries  # folded into the journal: a long session's entries are not held through the run
    # ``_recorded_contract`` checked that the contract hashes to the recorded hash: not hashed again.
    recorded_hash = str(started.get("contract_hash"))
    run = _Run(runtime, contract, journal, stop, connector=connector, contract_hash=recorded_hash)
    if held is not None:  # the run's live steps get the collector as always
        if journal.turns:
            journal.on_replayed = held.release
        else:
            held.release()
    return await run.drive(principal=started.get("principal"), resumed_from=started, owned=owned)


async def _resume_overlapped(
    runtime: Runtime, session: str, stop: anyio.Event | None, held: ReplayCollections
) -> RunOutcome:
    """A resume whose servers start while its verified read goes on (docs/durability.md).

    In order: the read runs in a worker thread; once the batch holding ``session_started`` has
    proven (the reader yields nothing before), the recorded contract is loaded from it, the lease
    taken and the servers started from that contract; then the rest of the read, and only then the
    refusals, every run event and every append. Whatever stops the resume before the run takes the
    servers (the read fails, a refusal, a session that ended) stops them first. Anything that keeps
    them from starting early (no proven start, a contract that does not load, the lease refused)
    leaves the resume to happen in order, with the whole read first, so it fails as it always did.
    """
    reading = _Reading(runtime.store, session)
    outcome: RunOutcome | None = None
    with _one_error():  # the reader never fails (it keeps its error)
        async with anyio.create_task_group() as group:
            group.start_soon(reading.run)
            outcome = await _resume_while_reading(runtime, session, stop, reading, group, held=held)
    assert outcome is not None  # the body returned (else this line is not reached)
    return outcome


async def _resume_while_reading(
    runtime: Runtime,
    session: str,
    stop: anyio.Event | None,
    reading: _Reading,
    group: TaskGroup,
    *,
    held: ReplayCollections,
) -> RunOutcome:
    store = runtime.store
    contract = _loadable(session, await reading.started())
    if contract is None:
        return await _resume_read(runtime, session, await reading.whole(), stop, held=held)
    try:
        lease = await anyio.to_thread.run_sync(
            lambda: store.acquire_lease(session, runtime.lease_owner, ttl_ms=runtime.lease_ms)
        )
    except TrussError:
        # Busy (or the store refused): the read's error and the refusals come first, as in order;
        # the run then asks for the lease again and is refused the same way.
        return await _resume_read(runtime, session, await reading.whole(), stop, held=held)
    owned = _Owned(store, lease, runtime.lease_ms)
    async with owned.held():
        early = _EarlyServers(
            runtime.connect(),
            contract,
            log_dir=runtime.home / "logs" / session,
            environ=runtime.environ,
            clock=runtime.clock,
        )
        group.start_soon(early.host)
        try:
            return await _resume_read(
                runtime,
                session,
                await reading.whole(),
                stop,
                contract=contract,
                owned=owned,
                connector=early.attach,
                held=held,
            )
        finally:
            await early.discard()  # a no-op once the run took and closed them


def _loadable(session: str, started: Mapping[str, Any] | None) -> Contract | None:
    """The contract a proven ``session_started`` records, or None when the servers must wait for the
    whole read (no proven start, or a contract that does not load: the in-order resume says why)."""
    if started is None:
        return None
    try:
        return _recorded_contract(session, started)
    except TrussError:
        return None


def _waits_for_a_person(store: LedgerStore, listed: SessionInfo) -> bool:
    """Whether the store's last entry of ``listed`` (unverified) says it suspended for an approval or a
    signal: such a resume is usually refused after its read, so its servers are not started early.

    A hint that only orders the work: what is refused is decided on the verified read either way,
    and unverified bytes can only keep servers from starting early, never start one."""
    if listed.status != "suspended" or int(listed.entries) < 1:
        return False
    last = next(iter(unverified(store).read_session(listed.id, from_seq=int(listed.entries) - 1)), None)
    body: Any = None if last is None else last.entry.get("body")
    if last is None or last.entry.get("kind") != "session_suspended" or not isinstance(body, dict):
        return False
    return cast(dict[str, Any], body).get("reason") in ("approval", "signal")


def check_session_id(session_id: str) -> None:
    """Refuse a caller's session id that is not 1-64 of ``[A-Za-z0-9_.-]`` starting alphanumeric."""
    if not SESSION_ID_RE.match(session_id):
        raise UsageError(
            f"session id {session_id!r} is not usable",
            remedy="Use 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit",
        )


def approve_call(
    runtime: Runtime, session: str, call: str, *, approved: bool, reason: str | None = None, by: str | None = None
) -> StoredEntry:
    """Record a person's decision on a call waiting for approval (``approval_decided``)."""
    store = runtime.store
    if unverified(store).session(session) is None:
        raise NotFoundError(f"no session {session!r} in this ledger", what="session", name=session,
                            remedy="List sessions with 'truss sessions'")  # fmt: skip
    entries: list[StoredEntry] = list(store.read_session(session))  # verified whole, once
    requested = {str(e.body.get("call")): e for e in entries if e.kind == "approval_requested"}
    decided = {str(e.body.get("call")) for e in entries if e.kind == "approval_decided"}
    if call not in requested:
        raise NotFoundError(
            f"session {session} has no call {call!r} waiting for approval",
            remedy=f"Calls waiting: {', '.join(pending_approvals(entries)) or 'none'}",
            what="call",
            name=call,
        )
    if call in decided:
        raise UsageError(f"call {call} of session {session} was already decided", remedy="A decision is final")
    if reason is not None and len(reason) > 2000:
        raise UsageError("--reason is longer than 2000 characters", remedy="Shorten the reason")
    body: dict[str, Any] = {"call": call, "approved": approved, "request": requested[call].seq}
    if reason:
        body["reason"] = reason
    if by:
        body["by"] = by
    [entry] = store.append(session, [Record("approval_decided", body)], durable=True, expect_seq=entries[-1].seq + 1)
    return entry


# The kinds ``pending_approvals`` and ``pending_signals`` read (each ignores every other entry).
_WAITING_KINDS = frozenset(
    {"approval_requested", "approval_decided", "signal_received", "mcp_tool_call", "mcp_tool_pending"}
)


def pending_approvals(entries: list[StoredEntry]) -> list[str]:
    """Call ids with ``approval_requested`` and no ``approval_decided``, in request order."""
    decided = {str(e.body.get("call")) for e in entries if e.kind == "approval_decided"}
    return [
        str(e.body.get("call")) for e in entries if e.kind == "approval_requested" and e.body.get("call") not in decided
    ]


def pending_signals(entries: list[StoredEntry]) -> dict[str, str]:
    """Call id -> signal name of each call waiting for ``truss signal`` (pending, no signal received)."""
    waiting = [e for e in entries if e.kind == "mcp_tool_pending" and e.body.get("kind") == "signal"]
    if not waiting:  # the usual case: no call ever waited for a signal, so no other entry matters
        return {}
    done = {str(e.body.get("call")) for e in entries if e.kind in ("signal_received", "mcp_tool_call")}
    return {str(e.body.get("call")): str(e.body.get("signal")) for e in waiting if str(e.body.get("call")) not in done}


_OUTCOME_TAIL = 8  # entries an ended session's outcome is read from: its verdict is among the last few


def outcome_of(store: LedgerStore, session: str) -> RunOutcome:
    """The outcome of a session as recorded (for a repeated session id, a finished resume, status)."""
    info = store.session(session)
    if info is None:
        raise NotFoundError(f"no session {session!r} in this ledger", what="session", name=session)
    entries: list[StoredEntry] = []
    if info.ended:
        # An ended session says its outcome in its last entries (the verdict, then session_ended):
        # read those, not the whole session, so showing a 5,000-call run's outcome is a lookup.
        entries = list(store.read_session(session, from_seq=max(0, int(info.entries) - _OUTCOME_TAIL)))
        if not any(e.kind == "verdict" for e in entries):
            entries = []
    if not entries:
        entries = list(store.read_session(session))
    verdict = next((e.body for e in reversed(entries) if e.kind == "verdict"), None)
    suspended = next((e.body for e in reversed(entries) if e.kind == "session_suspended"), None)
    status = str(info.status)
    reason = verdict.get("reason") if verdict else (suspended.get("reason") if suspended else None)
    checkpoint = _envelope_checkpoint(store.envelope(session))
    head = entries[-1].hash if entries else None
    waiting = () if info.ended else tuple(pending_approvals(entries))  # nothing waits once a session ended
    waiting_on: str | None = None
    if suspended is not None and status in ("suspended", "interrupted"):
        # The same answer as the run that suspended gave: what it waits on, and for which calls.
        waiting_on = str(suspended.get("reason"))
        if waiting_on != "approval":
            waiting = tuple(str(c) for c in suspended.get("calls") or ())
    return RunOutcome(session, status, dict(verdict) if verdict else None, head, checkpoint,
                      EXIT_CODES.get(status, 4), str(reason) if reason else None, waiting, waiting_on)  # fmt: skip


# -- the run -----------------------------------------------------------------------------------------


class _Run:
    def __init__(
        self,
        runtime: Runtime,
        contract: Contract,
        journal: Journal,
        stop: anyio.Event | None,
        *,
        connector: Connector | None = None,
        contract_hash: str | None = None,
    ) -> None:
        self.contract = contract
        # The contract's hash, computed once for the run (it is recorded at the start, in the verdict
        # and its envelope; a 5,000-step plan takes milliseconds to hash); a resume hands over the
        # recorded hash its loaded contract was just checked against.
        self.contract_hash = contract_hash or contract.hash
        self.store = runtime.store
        self.key = runtime.signer
        self.clock = runtime.clock
        self.home = runtime.home
        self.environ = runtime.environ
        self.connector = connector or runtime.connect()
        self.journal = journal
        bus = EventBus(list(runtime.events))
        self.events = RunEvents(bus, runtime.clock, journal.session, start_seq=journal.next_seq)
        self.provider_factory = runtime.provider
        self.stop = stop
        self.session = journal.session
        self.redactor = Redactor(contract, runtime.environ)
        self.server_records: list[Record] = []  # reported by launchers, not yet appended
        self.server_records_wake = anyio.Event()
        self.owner = runtime.lease_owner
        self.lease_ms = runtime.lease_ms

    async def drive(
        self, *, principal: Any, resumed_from: Mapping[str, Any] | None, owned: _Owned | None = None
    ) -> RunOutcome:
        """Drive the session as its one owner: take its lease (a second driver is refused with
        ``SessionBusyError``, exit 3), renew it while the run goes on, and carry its epoch on every
        append (the store refuses them once another process took over); give it up on the way out.
        ``owned``: the lease already taken and held by the caller (a resume that started early)."""
        if owned is not None:
            return await self._drive_owned(owned, principal=principal, resumed_from=resumed_from)
        lease = await anyio.to_thread.run_sync(
            lambda: self.store.acquire_lease(self.session, self.owner, ttl_ms=self.lease_ms)
        )
        owned = _Owned(self.store, lease, self.lease_ms)
        async with owned.held():
            return await self._drive_owned(owned, principal=principal, resumed_from=resumed_from)

    async def _drive_owned(
        self, owned: _Owned, *, principal: Any, resumed_from: Mapping[str, Any] | None
    ) -> RunOutcome:
        self.journal.epoch = owned.lease.epoch
        outcome = await self._drive_leg(principal=principal, resumed_from=resumed_from)
        owned.ended = outcome.status in TERMINAL  # an ended session needs no owner
        return outcome

    async def _drive_leg(self, *, principal: Any, resumed_from: Mapping[str, Any] | None) -> RunOutcome:
        """The run leg as one span of events: ``SessionStarted`` first, ``SessionEnded`` on every way out."""
        name, resumed = self.contract.contract.name, resumed_from is not None
        agent = self.contract.agent
        self.events.session_started(contract=name, contract_hash=self.contract_hash, resumed=resumed,
                                    provider=agent.provider, model=agent.model)  # fmt: skip
        status, reason = "error", None
        try:
            outcome = await self._drive(principal=principal, resumed_from=resumed_from)
            status, reason = outcome.status, outcome.reason
            return outcome
        except BaseException as exc:
            reason = type(exc).__name__
            raise
        finally:
            self.events.session_ended(status, reason, self.journal.head)

    async def _drive(self, *, principal: Any, resumed_from: Mapping[str, Any] | None) -> RunOutcome:
        # Both clocks at once: the gate measures the deadline on the monotonic one from here.
        budget, started_monotonic = BudgetState.start(self.clock.now_ms()), self.clock.monotonic()
        log_dir = self.home / "logs" / self.session
        log_dir.mkdir(parents=True, exist_ok=True)
        intent = render_intent(self.contract, self.environ)
        provider = self._make_provider()
        try:
            reviewers = await open_reviewers(self.contract, environ=self.environ, clock=self.clock)
        except BaseException:
            await provider.aclose()
            raise
        entered = False
        results: list[LoopResult] = []  # stays empty when the stop event cancelled the loop
        gates: list[Gate] = []
        reviewed = False
        try:
            # A stop request (Ctrl-C, SIGTERM) cancels connecting as well as the loop; the servers'
            # shutdown in the connector's exit is shielded, so they are ended either way.
            async with (
                _stoppable(self.stop),
                self.connector(
                    self.contract,
                    log_dir=log_dir,
                    environ=self.environ,
                    clock=self.clock,
                    on_event=self._server_event,
                ) as mounts,
            ):
                entered = True
                if resumed_from is None:
                    await self._started(mounts, principal)
                else:
                    await self._resumed(mounts, resumed_from)
                await self._record_server_events()  # what the servers tried while starting
                async with self._recording():  # the servers' later reports, as they come
                    gate = Gate(
                        contract=self.contract,
                        journal=self.journal,
                        transport=mounts,
                        tools=mounts.tools,
                        clock=self.clock,
                        budget=budget,
                        redactor=self.redactor,
                        events=self.events,
                        started_monotonic=started_monotonic,
                    )
                    result = await run_loop(
                        contract=self.contract,
                        gate=gate,
                        provider=provider,
                        clock=self.clock,
                        intent=intent,
                        redactor=self.redactor,
                        events=self.events,
                    )
                    results.append(result)
                    gates.append(gate)
            reviewed = await self._review(results, gates, intent, reviewers)
        except InDoubtError as exc:
            return await self._suspend("in_doubt", (str(exc.fields.get("call")),), exc.message)
        except ReplayDivergenceError as exc:
            await self._reload()
            await self._record_server_events()
            if self.journal.head is not None:
                # The divergence is on the record: which step, what was recorded, what was asked.
                found = {k: exc.fields.get(k) for k in ("seq", "expected", "actual") if exc.fields.get(k) is not None}
                with anyio.CancelScope(shield=True):
                    await self.journal.append(Record("session_suspended", {"reason": "diverged", **found}))
            return RunOutcome(self.session, "diverged", None, self._head(), None, 4, exc.message)
        except LoginRequiredError as exc:
            if not entered:
                return await self._start_failed(exc, principal)
            # A call needed a person (an OAuth step-up): recorded as that call's failure; the run ends.
            error = RunError("server", self.redactor.scrub_text(exc.message))
            verdict = self._verdict(final_text=None, error=error)
            return dataclasses.replace(await self._seal(verdict), exit_code=exc.exit_code)
        except TrussError as exc:
            if entered or not isinstance(exc, McpError | InputError):
                raise
            return await self._start_failed(exc, principal)
        finally:
            await provider.aclose()
            await reviewers.aclose()
        if not results or not reviewed:
            return await self._suspend("interrupted", (), "the run was interrupted (Ctrl-C or SIGTERM)")
        result = results[0]
        if result.stop == "suspended":
            return await self._suspend(result.waiting_on, result.waiting, result.reason)
        return await self._finish(result)

    async def _review(self, results: list[LoopResult], gates: list[Gate], intent: str, reviewers: ReviewerSet) -> bool:
        """The panel checks' reviews, once the run has its final answer (after the servers closed:
        reviewers need none). False when a stop request cancelled them (the run is then interrupted).
        ``results`` and ``gates`` are empty when the stop event cancelled the loop."""
        if not results or not gates or results[0].stop != "done" or not len(reviewers):
            return True
        gate = gates[0]
        done = False
        async with _stoppable(self.stop):
            await run_panels(contract=self.contract, journal=self.journal, gate=gate, clock=self.clock, intent=intent,
                             redactor=self.redactor, reviewers=reviewers, events=self.events)  # fmt: skip
            done = True
        return done

    # -- what launchers report that the record keeps (sandbox_egress) ---------------------------

    @asynccontextmanager
    async def _recording(self) -> AsyncGenerator[None]:
        """Append launchers' reports as they come while the body runs; the body's own exception
        passes through as it was raised (not wrapped in a group), the recorder never outlives it."""
        failure: BaseException | None = None
        async with anyio.create_task_group() as recorders:
            recorders.start_soon(self._pump_server_events)
            try:
                yield
            except BaseException as exc:  # re-raised below, once the recorder has stopped
                failure = exc
            finally:
                recorders.cancel_scope.cancel()
        if failure is not None:
            raise failure

    def _server_event(self, server: str, name: str, attributes: Mapping[str, Any]) -> None:
        """A launcher's or auth flow's report: an event for subscribers; some kinds also an entry.

        Reports that come before ``session_started`` (a server's start-up) wait and are appended
        right after it; later ones are appended by ``_pump_server_events`` as they come, and the
        last ones (a sandbox's flood summaries at its end) before the verdict or the suspension.
        """
        # Scrubbed before any subscriber sees it, as before it is recorded: a server writes what it
        # reports (the host and method it asked a sandbox's proxy for), and telemetry sends it on.
        body = cast(dict[str, Any], self.redactor.scrub(dict(attributes)))
        if isinstance(body.get("host"), str):
            body["host"] = self.redactor.scrub_text(body["host"], ignore_case=True)
        self.events.server_event(server, name, body)
        if name in RECORDED_SERVER_EVENTS:
            self.server_records.append(Record(name, {**body, "server": server}))
            self.server_records_wake.set()

    async def _record_server_events(self) -> None:
        if not self.server_records or self.journal.head is None:
            return  # nothing reported, or no session_started yet to follow
        batch, self.server_records = self.server_records, []
        with anyio.CancelScope(shield=True):  # taken from the queue: it must reach the record
            await self.journal.append(*batch, durable=False)

    async def _pump_server_events(self) -> None:
        while True:
            await self.server_records_wake.wait()
            self.server_records_wake = anyio.Event()
            await self._record_server_events()

    def _make_provider(self) -> Provider:
        if self.provider_factory is not None:
            return self.provider_factory(self.contract)
        from truss.providers import make_provider

        return make_provider(self.contract, environ=self.environ, clock=self.clock)

    async def _started(self, mounts: MountSet, principal: Any) -> None:
        servers: dict[str, Any] = {}
        for name, status in dict(getattr(mounts, "servers", None) or {}).items():
            servers[str(name)] = _server_json(status)
        body: dict[str, Any] = {
            "contract": self.contract.contract.name,
            "contract_hash": self.contract_hash,
            "effective": self.contract.to_json(),
            "pins": dict(sorted(dict(mounts.pins()).items())),
            "servers": servers,
            "truss_version": __version__,
            "provider": self.contract.agent.provider,
        }
        if principal is not None:
            body["principal"] = principal
        await self.journal.append(Record("session_started", body), durable=True, expect_seq=0)

    async def _resumed(self, mounts: MountSet, started: Mapping[str, Any]) -> None:
        recorded: Mapping[str, Any] = started.get("pins") or {}
        live = dict(mounts.pins())
        changed = sorted(name for name, pin in recorded.items() if live.get(name) != pin)
        if changed:
            raise ReplayDivergenceError(
                f"resumed session {self.session}: the definition of {', '.join(changed)} changed since the run started",
                remedy="The servers no longer offer the tools this run was started with; start a new run",
                session=self.session,
                expected="recorded pins",
                actual="changed pins: " + ", ".join(changed),
            )
        servers: Mapping[str, Any] = started.get("servers") or {}
        for name, status in dict(getattr(mounts, "servers", None) or {}).items():
            now = _server_json(status)
            then: Mapping[str, Any] = servers.get(str(name)) or {}
            for seam in ("launcher", "auth"):
                if canonical(_reach_identity(now.get(seam))) != canonical(_reach_identity(then.get(seam))):
                    raise ReplayDivergenceError(
                        f"resumed session {self.session}: MCP server {name!r} is reached differently than when the "
                        f"run started (its {seam} description changed"
                        + (", e.g. its sandbox profile" if seam == "launcher" else "")
                        + ")",
                        remedy="Resume where the run started (same contract, operator config, sandbox and "
                        "credentials), or start a new run",
                        session=self.session,
                        expected=f"the recorded {seam} of {name}",
                        actual=f"a different {seam}",
                    )
        await self.journal.append(
            Record("session_resumed", {"reason": "resume", "from_seq": self.journal.next_seq}),
            durable=True,
            expect_seq=self.journal.next_seq,
        )

    async def _start_failed(self, exc: TrussError, principal: Any) -> RunOutcome:
        """A server that could not start: the attempt is still recorded, with an ``error`` verdict."""
        if self.journal.head is not None:
            raise exc
        body: dict[str, Any] = {
            "contract": self.contract.contract.name,
            "contract_hash": self.contract_hash,
            "effective": self.contract.to_json(),
            "pins": {},
            "servers": {},
            "start_failure": self.redactor.scrub(exc.to_json()),
            "truss_version": __version__,
            "provider": self.contract.agent.provider,
        }
        if principal is not None:
            body["principal"] = principal
        await self.journal.append(Record("session_started", body), durable=True, expect_seq=0)
        await self._record_server_events()  # what the server tried before its start failed
        cause = "server" if isinstance(exc, McpError) else "input"
        detail = exc.message
        if isinstance(exc, SandboxError) and exc.remedy:  # cause and remedy, in the verdict itself
            detail = f"{detail}. {exc.remedy}"
        error = RunError(cause, self.redactor.scrub_text(detail))
        verdict = self._verdict(final_text=None, error=error)
        outcome = await self._seal(verdict)
        if isinstance(exc, LoginRequiredError):  # an OAuth server needs `truss mcp login` first: exit 5
            outcome = dataclasses.replace(outcome, exit_code=exc.exit_code)
        return outcome

    async def _finish(self, result: LoopResult) -> RunOutcome:
        error: RunError | None = None
        if result.stop == "budget":
            error = RunError("budget", result.reason or "a budget ran out", result.limit)
        elif result.stop == "deadline":
            error = RunError("deadline", result.reason or "the deadline passed", "deadline")
        elif result.stop == "provider_error":
            error = RunError("provider", self.redactor.scrub_text(result.reason or "the model provider failed"))
        return await self._seal(self._verdict(final_text=result.final_text, error=error))

    def _verdict(self, *, final_text: str | None, error: RunError | None) -> Verdict:
        """The done checks over the whole session, folded entry by entry as the journal indexed them
        (a resumed run's recorded entries too)."""
        return _folds(self.journal).verdict.verdict(final_text=final_text, error=error)

    async def _seal(self, verdict: Verdict) -> RunOutcome:
        await self._record_server_events()  # the servers' last reports come as they end
        body = verdict.to_json()
        body["contract_hash"] = self.contract_hash
        recorded = self.journal.verdict
        if recorded is not None:
            # A run killed while sealing (after the verdict, before session_ended): the replayed run
            # must reach the verdict it recorded; then only the end is missing.
            if canonical(recorded.body) != canonical(body):
                raise ReplayDivergenceError(
                    f"resumed session {self.session} reached a different verdict than the one recorded",
                    remedy="The run no longer matches its record; start a new run",
                    session=self.session,
                    seq=recorded.seq,
                    expected=f"verdict {recorded.body.get('status')}",
                    actual=f"verdict {body.get('status')}",
                )
        else:
            await self.journal.append(Record("verdict", body), durable=True)
        verdict_entry = self.journal.verdict
        assert verdict_entry is not None  # recorded before, or appended just above
        _faults.fault("during_verdict")
        [ended] = await self.journal.append(Record("session_ended", {"status": verdict.status}), durable=True)
        await self._settle_quotas()
        checkpoint = await anyio.to_thread.run_sync(lambda: _sign_checkpoint(self.store, self.key))
        self.events.checkpoint_signed(checkpoint)
        predicate = {
            "status": verdict.status,
            "checks": body["checks"],
            "contract_hash": self.contract_hash,
            "head": ended.hash,
            "checkpoint": checkpoint,
        }
        envelope = _verdict_envelope(self.session, ended.hash, predicate, self.key)
        self.store.set_envelope(self.session, envelope)
        self.events.verdict(verdict.status, verdict.reason, verdict_entry)
        await self._witness(checkpoint)
        return RunOutcome(self.session, verdict.status, body, ended.hash, checkpoint, EXIT_CODES[verdict.status],
                          verdict.reason)  # fmt: skip

    async def _settle_quotas(self) -> None:
        """Settle the run's quota reservation to what it used; a failure here is settled later by
        the next reservation that sees the ended session (``truss._quota_book``).

        What it used was tallied as the journal indexed the session's entries (a resume's through the
        verified reader): reading them back through the store would verify the whole session a
        second time at every run's end."""
        tally = _folds(self.journal).usage
        if tally is None:
            return
        now = self.clock.now_ms()
        with contextlib.suppress(TrussError), anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lambda: quota_settle(self.store, self.session, now_ms=now, usage=tally))

    async def _witness(self, checkpoint: str) -> None:
        """Submit the end-of-session checkpoint to the home's witnesses, if it has any (never raises:
        a run whose witnesses are down still ends with its verdict, recorded as not yet witnessed)."""
        if not (self.home / "witness.toml").exists():
            return
        from truss.witness.submit import witness_at_session_end

        report = await witness_at_session_end(self.store, self.home, self.clock, checkpoint)
        if report is not None:
            outcomes = tuple((o.witness, o.outcome) for o in report.outcomes)
            self.events.checkpoint_witnessed(report.size, report.witnessed, report.summary(), outcomes)

    async def _suspend(self, reason: str, calls: tuple[str, ...], detail: str | None) -> RunOutcome:
        await self._reload()
        await self._record_server_events()
        if self.journal.head is None:  # stopped before anything was recorded: nothing to resume
            return RunOutcome(self.session, "interrupted", None, None, None, 3, detail)
        body: dict[str, Any] = {"reason": reason}
        if calls:
            body["calls"] = list(calls)
        in_flight = [c.call for c in self.journal.calls.values() if c.intent is not None and c.result is None]
        if in_flight:
            body["in_flight"] = sorted(in_flight)
        status = "interrupted" if reason == "interrupted" else "suspended"
        checkpoint: str | None = None
        entry: StoredEntry | None = None
        # Shielded: an interrupted run still records that it was interrupted.
        with anyio.CancelScope(shield=True):
            [entry] = await self.journal.append(Record("session_suspended", body), durable=True)
            checkpoint = await anyio.to_thread.run_sync(lambda: _sign_checkpoint(self.store, self.key))
        self.events.checkpoint_signed(checkpoint)
        self.events.suspended(reason, calls, detail, entry)
        return RunOutcome(self.session, status, None, self._head(), checkpoint, 3, detail, calls, reason)

    async def _reload(self) -> None:
        """Index what the record holds after the journal's head: a cancelled step may have committed
        after its caller stopped listening."""
        after = self.journal.next_seq

        def read() -> list[StoredEntry]:
            # The listing's count is written in the transaction of each append: when it holds no
            # entry past the head, skip the verified read, which proves the whole session from its
            # first entry and keeps its payloads (10 MB at 3,000 calls, held after a suspension).
            listed = unverified(self.store).session(self.session)
            if listed is not None and int(listed.entries) <= after:
                return []
            return list(self.store.read_session(self.session, from_seq=after))

        entries = await anyio.to_thread.run_sync(read)
        self.journal.extend(entries)

    def _head(self) -> str | None:
        head = self.journal.head
        return head.hash if head else None


@dataclass
class _Folds:
    """What the run's end needs of the whole session, folded as the journal indexes each entry: the
    verdict's done checks and, when the contract has quotas, what the run used of them."""

    verdict: VerdictFold
    usage: UsageTally | None

    def add(self, entry: StoredEntry) -> None:
        self.verdict.add(entry)
        if self.usage is not None:
            self.usage.add(entry)


class _Owned:
    """A session's lease while its owner drives it: renewed every third of its length (one store
    write each; ``lease`` is the latest renewal, so a day-long run keeps one), given up on the way
    out unless the session ``ended``."""

    def __init__(self, store: LedgerStore, lease: Lease, ttl_ms: int) -> None:
        self.store = store
        self.lease = lease
        self.ttl_ms = ttl_ms
        self.ended = False

    @asynccontextmanager
    async def held(self) -> AsyncGenerator[None]:
        try:
            with _one_error():  # the renewer never fails
                async with anyio.create_task_group() as group:
                    group.start_soon(self._renew)
                    try:
                        yield
                    finally:
                        group.cancel_scope.cancel()
        finally:
            if not self.ended:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self._release)

    async def _renew(self) -> None:
        while True:
            await anyio.sleep(self.ttl_ms / 3000)
            try:
                self.lease = await anyio.to_thread.run_sync(
                    lambda: self.store.renew_lease(self.lease, ttl_ms=self.ttl_ms)
                )
            except StoreConflictError:
                return  # taken over: this run's next append is refused by the store (fencing)
            except TrussError:
                continue  # the store was busy or unreachable: try again next period

    def _release(self) -> None:
        with contextlib.suppress(TrussError):
            self.store.release_lease(self.lease)


class _Reading:
    """A session's verified read (R1) in a worker thread, for a resume that starts its servers
    before the read ends. ``started`` is the ``session_started`` body once the reader yielded it
    (the reader yields an entry only once its whole batch proved: signature, chain, Merkle
    inclusion); ``whole`` is every entry, or the read's error, raised as the in-order read raises it."""

    def __init__(self, store: LedgerStore, session: str) -> None:
        self._store = store
        self._session = session
        self._entries: list[StoredEntry] = []
        self._first = anyio.Event()
        self._done = anyio.Event()
        self._error: Exception | None = None

    async def run(self) -> None:
        try:
            await anyio.to_thread.run_sync(self._read)
        except Exception as exc:  # raised by ``whole``, where the in-order resume would have raised it
            self._error = exc
        finally:
            self._first.set()
            self._done.set()

    def _read(self) -> None:
        entries = self._entries
        for entry in self._store.read_session(self._session):
            entries.append(entry)
            if len(entries) == 1:
                anyio.from_thread.run_sync(self._first.set)

    async def started(self) -> Mapping[str, Any] | None:
        """The proven ``session_started`` body; None when the read failed before it or the session
        does not start with one (the whole read then says what is wrong)."""
        await self._first.wait()
        if not self._entries or self._entries[0].kind != "session_started" or self._entries[0].seq != 0:
            return None
        return self._entries[0].body

    async def whole(self) -> list[StoredEntry]:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        entries, self._entries = self._entries, []  # the caller's now: not held here through the run
        return entries


class _EarlyServers:
    """A resumed run's servers, started from the contract its proven ``session_started`` records
    while the rest of the session is read and verified (``_resume_overlapped``).

    The connector runs in a task of its own (``host``) until the run takes the servers through
    ``attach`` (the run's connector: it yields the started ones, raises their start error, and
    closes them on its way out, as the connector's own exit would) or they are ``discard``ed. What
    the launchers report is held until the run takes it; discarded, the servers stop and their
    reports are dropped, so a resume refused after its read leaves no event and no entry."""

    def __init__(
        self, connector: Connector, contract: Contract, *, log_dir: Path, environ: Mapping[str, str], clock: Clock
    ) -> None:
        self._connect = connector
        self._contract = contract
        self._log_dir = log_dir
        self._environ = environ
        self._clock = clock
        self._scope = anyio.CancelScope()
        self._ready = anyio.Event()  # connected, or failed to
        self._close = anyio.Event()
        self._done = anyio.Event()
        self._hosting = False
        self._mounts: Any = None
        self._error: Exception | None = None
        self._held: list[tuple[str, str, Mapping[str, Any]]] | None = []
        self._sink: Callable[[str, str, Mapping[str, Any]], None] | None = None

    def _report(self, server: str, name: str, attributes: Mapping[str, Any]) -> None:
        if self._sink is not None:
            self._sink(server, name, attributes)
        elif self._held is not None:
            self._held.append((server, name, dict(attributes)))

    async def host(self) -> None:
        if self._scope.cancel_called:
            return  # discarded before this task ran: nothing was started
        self._hosting = True
        try:
            with self._scope:
                self._log_dir.mkdir(parents=True, exist_ok=True)
                async with self._connect(
                    self._contract, log_dir=self._log_dir, environ=self._environ, clock=self._clock,
                    on_event=self._report,
                ) as mounts:  # fmt: skip
                    self._mounts = mounts
                    self._ready.set()
                    await self._close.wait()
        except Exception as exc:  # raised where the run enters its servers, as the connector raises it
            self._error = exc
        finally:
            self._ready.set()
            self._done.set()

    async def _stop(self) -> None:
        """Close the servers (or stop them connecting) and wait until every one has ended."""
        if self._mounts is not None:
            self._close.set()
        else:
            self._scope.cancel()
        if self._hosting:
            with anyio.CancelScope(shield=True):  # the connector ends every process group on its way out
                await self._done.wait()

    async def discard(self) -> None:
        """Stop the servers with nothing said (a no-op once the run closed them)."""
        self._sink, self._held = None, None
        await self._stop()

    @asynccontextmanager
    async def attach(self, contract: Contract, *, on_event: Callable[[str, str, Mapping[str, Any]], None],
                     **_: Any) -> AsyncGenerator[Any]:  # fmt: skip
        assert contract is self._contract  # the run's contract is the one the servers started from
        held, self._held = self._held or [], None
        self._sink = on_event
        for server, name, attributes in held:
            on_event(server, name, attributes)
        try:
            await self._ready.wait()
        except BaseException:  # a stop request while they connect
            await self._stop()
            raise
        if self._error is not None or self._mounts is None:
            await self._stop()
            raise self._error or McpError("the MCP servers did not start", remedy="Run `truss resume` again")
        try:
            yield self._mounts
        finally:
            await self._stop()
        if self._error is not None:
            raise self._error  # closing failed, as the connector's own exit would have raised it


def _journal(
    store: LedgerStore,
    session: str,
    contract: Contract,
    *,
    recorded: list[StoredEntry] | None = None,
    chained: bool = False,
) -> Journal:
    """The run's journal: it keeps every entry only when a check needs the whole record (a panel).
    ``chained``: ``recorded`` is a verified read of the whole session (``Journal.extend``)."""
    folds = _Folds(VerdictFold(contract, store.blob), UsageTally() if quotas_of(contract) else None)
    keep = not folds.verdict.folds_all or uses_panel(contract.done.checks)
    return Journal(store, session, recorded=recorded or (), chained=chained, keep_entries=keep, fold=folds)


def _folds(journal: Journal) -> _Folds:
    assert isinstance(journal.fold, _Folds)  # every journal of a run is built by _journal
    return journal.fold


@asynccontextmanager
async def _stoppable(stop: anyio.Event | None) -> AsyncGenerator[None]:
    """Run the body until it ends or ``stop`` is set (Ctrl-C / SIGTERM in the CLI, a cancel in serve-mcp)."""
    with _one_error():  # the watcher never fails
        async with anyio.create_task_group() as group:
            if stop is not None:

                async def watch() -> None:
                    await stop.wait()
                    group.cancel_scope.cancel()

                group.start_soon(watch)
            try:
                yield
            finally:
                group.cancel_scope.cancel()


@contextlib.contextmanager
def _one_error() -> Generator[None]:
    """Around a task group whose helper tasks never fail: a group holds the body's one error, so
    raise it as itself, and callers (and the CLI's one handler) see a Truss error, not a group."""
    try:
        yield
    except BaseExceptionGroup as group_error:
        if len(group_error.exceptions) == 1:
            raise group_error.exceptions[0] from None
        raise


def _server_json(status: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("transport", "protocol_version", "server_info", "instructions", "launcher", "auth"):
        value = getattr(status, name, None)
        if value is not None:
            out[name] = value
    return out


def _recorded_contract(session: str, started: Mapping[str, Any]) -> Contract:
    from pydantic import ValidationError

    try:
        contract = Contract.model_validate(started.get("effective"))
    except ValidationError as exc:
        raise ReplayDivergenceError(
            f"session {session}: the recorded effective contract cannot be loaded by this version of Truss",
            remedy="Resume with the Truss version that started the run",
            session=session,
            expected="a loadable contract",
            actual=f"{exc.error_count()} validation error(s)",
        ) from exc
    found = contract.hash
    if found != started.get("contract_hash"):
        raise ReplayDivergenceError(
            f"session {session}: the recorded effective contract does not hash to the recorded contract hash",
            remedy="Verify the ledger with 'truss ledger verify'",
            session=session,
            expected=str(started.get("contract_hash")),
            actual=found,
        )
    return contract


def _sign_checkpoint(store: LedgerStore, key: IdentityKey) -> str:
    # A worker key signs no checkpoint: it ends with the one the log key's publisher stores.
    checkpoint = end_checkpoint(store, key)
    return checkpoint.note.decode("utf-8") if checkpoint.note is not None else checkpoint.text()


def _verdict_envelope(session: str, head: str, predicate: dict[str, Any], key: IdentityKey) -> bytes:
    statement = verdict_statement(
        session=session,
        head=head,
        status=predicate["status"],
        checks=predicate["checks"],
        contract_hash=predicate["contract_hash"],
        checkpoint=predicate["checkpoint"],
    )
    return sign_verdict(statement, key).to_bytes()


def _envelope_checkpoint(envelope: bytes | None) -> str | None:
    if envelope is None:
        return None
    try:
        statement: Any = json.loads(base64.b64decode(json.loads(envelope)["payload"]))
        checkpoint: Any = statement["predicate"]["checkpoint"]
    except (ValueError, KeyError, TypeError):
        return None
    return checkpoint if isinstance(checkpoint, str) else None


# What an auth description may change between a run's start and its resume without the server
# being reached differently: an OAuth grant's expiry and scopes move with every refresh or step-up.
_VOLATILE_AUTH = ("expires_at_ms", "scopes")


def _reach_identity(described: Any) -> Any:
    """A launcher or auth description without the fields a token refresh changes."""
    if not isinstance(described, Mapping):
        return described
    fields = cast(Mapping[str, Any], described)
    if fields.get("kind") != "oauth":
        return fields
    return {k: v for k, v in fields.items() if k not in _VOLATILE_AUTH}
