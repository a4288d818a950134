"""The ``ServeBackend`` serve-mcp uses in production: sessions, the ledger store and bundles.

It loads contracts with the operator's layers (``truss.contract``), runs them with
``truss.session.run_contract`` over the runtime's connector (the real MCP client tier), and reads
answers, status, verification, verdict envelopes and bundles from the runtime's store. One
``Runtime`` serves the whole server process; its store is safe to share between runs and threads.
Each run gets a copy of the runtime whose progress subscriber is that run's.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, cast

import anyio

from truss._errors import BundleFormatError, RunSuspended, SessionBusyError, StoreConflictError
from truss._json import as_mapping
from truss.contract import Contract, load_contract, narrow_budget
from truss.events import ProgressEvent, progress_subscriber
from truss.ledger.verification import verify_ledger
from truss.mcp._serve_core import Principal
from truss.mcp.server import RunAnswer, SessionView
from truss.runtime import Runtime
from truss.session import RunOutcome, outcome_of, resume_session, run_contract

__all__ = ["LedgerBackend"]

_FOLLOW_POLL_S = 0.2
"""How often a replica waiting on a run another replica drives reads the session's status."""


async def _pause(stop: anyio.Event | None) -> None:
    """One poll interval, cut short when ``stop`` is set (the server is stopping)."""
    with anyio.move_on_after(_FOLLOW_POLL_S):
        if stop is not None:
            await stop.wait()
        else:
            await anyio.sleep(_FOLLOW_POLL_S)


class LedgerBackend:
    """Runs and reads sessions of one Truss home through ``runtime`` (opened by the caller).

    ``runtime.connector`` defaults to ``truss.mcp.client.connect`` when the runtime has none.
    """

    def __init__(self, runtime: Runtime) -> None:
        if runtime.connector is None:
            from truss.mcp.client import connect

            runtime = dataclasses.replace(runtime, connector=connect)
        self.runtime = runtime
        self.home = runtime.home
        self.store = runtime.store
        self.environ = dict(runtime.environ)
        self.trusted = runtime.trusted

    def load(self, path: Path, params: Mapping[str, Any], budget: Mapping[str, Any]) -> Contract:
        contract = load_contract(path, home=self.home, params=dict(params), environ=self.environ)
        if budget:
            contract = narrow_budget(contract, budget)
        return contract

    def _with_progress(self, on_progress: Callable[[Mapping[str, Any]], None]) -> Runtime:
        """This runtime with one more subscriber: the flat progress view of the run, for its caller."""

        def progress(event: ProgressEvent) -> None:
            on_progress(_event_json(event))

        events = (*self.runtime.events, progress_subscriber(progress))
        return dataclasses.replace(self.runtime, events=events)

    async def run(
        self,
        contract: Any,
        *,
        session_id: str,
        principal: Principal,
        on_progress: Callable[[Mapping[str, Any]], None],
        stop: anyio.Event | None = None,
    ) -> RunAnswer:
        runtime = self._with_progress(on_progress)
        try:
            outcome = await run_contract(
                runtime, contract, session_id=session_id, principal=principal.to_json(), stop=stop
            )
        except (StoreConflictError, SessionBusyError):
            # Another replica on the same ledger claimed this session first: it holds the session's
            # lease (taken before the session is recorded), or the store refused our session_started
            # (the session exists; UNIQUE (session, seq) when both insert at once). Nothing of ours
            # is recorded. Its run is the one; this caller gets its answer.
            info = await self._appeared(session_id, stop)
            if info is None or not principal.owns(info.principal):
                raise
            return await self.follow(session_id, stop=stop)
        if outcome.status == "running":  # recorded by a replica after our lookup: its run is the one
            return await self.follow(session_id, stop=stop)
        return _answer(outcome)

    async def _appeared(self, session_id: str, stop: anyio.Event | None) -> Any:
        """The session's row once the replica holding its lease recorded it (at most the lease's time)."""
        deadline = self.runtime.clock.monotonic() + self.runtime.lease_ms / 1000
        while True:
            info = await anyio.to_thread.run_sync(self.store.session, session_id)
            if info is not None or self.runtime.clock.monotonic() >= deadline or (stop is not None and stop.is_set()):
                return info
            await _pause(stop)

    async def follow(self, session_id: str, *, stop: anyio.Event | None = None) -> RunAnswer:
        """Poll the store until the session stops running (a replica drives it), or ``stop``; its answer."""
        while True:
            info = await anyio.to_thread.run_sync(self.store.session, session_id)
            if info is None or info.status != "running" or (stop is not None and stop.is_set()):
                break
            await _pause(stop)
        return await anyio.to_thread.run_sync(self.answer, session_id)

    async def resume(
        self,
        session_id: str,
        *,
        on_progress: Callable[[Mapping[str, Any]], None],
        stop: anyio.Event | None = None,
    ) -> RunAnswer:
        try:
            outcome = await resume_session(self._with_progress(on_progress), session_id, stop=stop)
        except RunSuspended:
            # Still waiting (an approval nobody gave yet): the answer is the session as recorded.
            outcome = outcome_of(self.store, session_id)
        return _answer(outcome)

    def lookup(self, session_id: str) -> SessionView | None:
        info = self.store.session(session_id)
        if info is None:
            return None
        return SessionView(session=info.id, principal=info.principal, status=info.status, contract=info.contract)

    def answer(self, session_id: str) -> RunAnswer:
        return _answer(outcome_of(self.store, session_id))

    def status(self, session_id: str) -> dict[str, Any]:
        info = self.store.session(session_id)
        kinds: Counter[str] = Counter()
        tokens = 0
        for entry in self.store.read_session(session_id):
            kinds[entry.kind] += 1
            if entry.kind == "model_turn":
                usage = as_mapping(entry.body.get("usage")) or {}
                for part in ("input_tokens", "output_tokens"):
                    value = usage.get(part)
                    if isinstance(value, int):
                        tokens += value
        report = verify_ledger(self.store, self.trusted, session=session_id)
        verification: dict[str, Any] = {"ok": report.ok, "entries": report.entries}
        if not report.ok:
            verification.update(reason=report.reason, message=report.message, seq=report.seq)
        return {
            "counts": {
                "entries": sum(kinds.values()),
                "tool_calls": kinds["mcp_tool_call"],
                "denials": kinds["mcp_tool_denied"],
                "model_turns": kinds["model_turn"],
                "approvals_requested": kinds["approval_requested"],
            },
            "budget_used": {
                "tool_calls": kinds["mcp_tool_intent"],
                "model_turns": kinds["model_turn"],
                "tokens": tokens,
                "elapsed_ms": max(0, int(info.updated_ms) - int(info.started_ms)) if info is not None else 0,
            },
            "head": info.head if info is not None else None,
            "verification": verification,
        }

    def envelope(self, session_id: str) -> Mapping[str, Any] | None:
        data = self.store.envelope(session_id)
        if data is None:
            return None
        try:
            value = json.loads(data)
        except ValueError:
            raise BundleFormatError(
                f"session {session_id}: the stored verdict envelope is not JSON",
                remedy="Verify the ledger with 'truss ledger verify'",
            ) from None
        return as_mapping(value)

    def export(self, session_id: str) -> bytes:
        from truss.ledger.bundle import export_bundle

        # The key may sign a checkpoint now when none covers the session yet (a suspended run).
        key = self.runtime.signer
        return export_bundle(self.store, session_id, vkey=key.verifier.vkey, payloads=True, signer=key)


def _answer(outcome: RunOutcome) -> RunAnswer:
    return RunAnswer(
        session=outcome.session,
        status=outcome.status,
        verdict=outcome.verdict,
        head=outcome.head,
        checkpoint=outcome.checkpoint,
        reason=outcome.reason,
        waiting=tuple(outcome.waiting),
        waiting_on=outcome.waiting_on,
    )


def _event_json(event: object) -> dict[str, Any]:
    raw: dict[str, Any]
    if is_dataclass(event) and not isinstance(event, type):
        raw = {f.name: getattr(event, f.name) for f in fields(event)}
    elif isinstance(event, Mapping):
        raw = {str(k): v for k, v in cast("Mapping[Any, Any]", event).items()}
    else:
        raw = {"detail": str(event)}
    out: dict[str, Any] = {}
    for name, value in raw.items():
        nested = as_mapping(value)
        if isinstance(value, str | int | float | bool) or value is None:
            out[name] = value
        elif nested is not None:
            out[name] = {k: v for k, v in nested.items() if isinstance(v, str | int | float | bool) or v is None}
    return out
