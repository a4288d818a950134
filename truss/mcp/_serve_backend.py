"""The ``ServeBackend`` serve-mcp uses in production: sessions, the SQLite ledger and bundles.

It loads contracts with the operator's layers (``truss.contract``), runs them with
``truss.session.run_contract`` over the real MCP client tier, and reads answers, status,
verification, verdict envelopes and bundles from the store. It holds one store and one identity
key for the whole server process; the store is safe to share between runs and threads.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, cast

import anyio

from truss._clock import Clock
from truss._errors import BundleFormatError, RunSuspended
from truss.contract import Contract, load_contract, narrow_budget
from truss.ledger.keys import IdentityKey, TrustedKeys
from truss.ledger.verify import verify_ledger
from truss.mcp._serve_core import Principal
from truss.mcp.server import RunAnswer, SessionView
from truss.session import RunOutcome, outcome_of, resume_session, run_contract

__all__ = ["LedgerBackend"]


class LedgerBackend:
    """Runs and reads sessions of one Truss home (``store`` and ``key`` opened by the caller)."""

    def __init__(
        self,
        *,
        home: Path,
        store: Any,
        key: IdentityKey,
        clock: Clock,
        environ: Mapping[str, str],
        connector: Callable[..., Any] | None = None,
    ) -> None:
        if connector is None:
            from truss.mcp.client import connect

            connector = connect
        self.home = home
        self.store = store
        self.key = key
        self.clock = clock
        self.environ = dict(environ)
        self.connector = connector
        self.trusted = TrustedKeys([key.verifier])

    def load(self, path: Path, params: Mapping[str, Any], budget: Mapping[str, Any]) -> Contract:
        contract = load_contract(path, home=self.home, params=dict(params), environ=self.environ)
        if budget:
            contract = narrow_budget(contract, budget)
        return contract

    async def run(
        self,
        contract: Any,
        *,
        session_id: str,
        principal: Principal,
        on_progress: Callable[[Mapping[str, Any]], None],
        stop: anyio.Event | None = None,
    ) -> RunAnswer:
        def progress(event: Any) -> None:
            on_progress(_event_json(event))

        outcome = await run_contract(
            contract,
            store=self.store,
            key=self.key,
            clock=self.clock,
            home=self.home,
            environ=self.environ,
            connector=self.connector,
            session_id=session_id,
            principal=principal.to_json(),
            on_progress=progress,
            stop=stop,
        )
        return _answer(outcome)

    async def resume(
        self,
        session_id: str,
        *,
        on_progress: Callable[[Mapping[str, Any]], None],
        stop: anyio.Event | None = None,
    ) -> RunAnswer:
        def progress(event: Any) -> None:
            on_progress(_event_json(event))

        try:
            outcome = await resume_session(
                session_id,
                store=self.store,
                key=self.key,
                clock=self.clock,
                home=self.home,
                environ=self.environ,
                connector=self.connector,
                on_progress=progress,
                stop=stop,
            )
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
                usage = entry.body.get("usage")
                if isinstance(usage, Mapping):
                    typed: Mapping[str, Any] = usage  # pyright: ignore[reportUnknownVariableType]
                    for part in ("input_tokens", "output_tokens"):
                        value = typed.get(part)
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
        return value if isinstance(value, dict) else None  # pyright: ignore[reportUnknownVariableType]

    def export(self, session_id: str) -> bytes:
        from truss.ledger.bundle import export_bundle

        # The key may sign a checkpoint now when none covers the session yet (a suspended run).
        return export_bundle(self.store, session_id, vkey=self.key.verifier.vkey, payloads=True, signer=self.key)


def _answer(outcome: RunOutcome) -> RunAnswer:
    return RunAnswer(
        session=outcome.session,
        status=outcome.status,
        verdict=outcome.verdict,
        head=outcome.head,
        checkpoint=outcome.checkpoint,
        reason=outcome.reason,
        waiting=tuple(outcome.waiting),
    )


def _event_json(event: Any) -> dict[str, Any]:
    raw: dict[str, Any]
    if is_dataclass(event) and not isinstance(event, type):
        raw = {f.name: getattr(event, f.name) for f in fields(event)}
    elif isinstance(event, Mapping):
        raw = {str(k): v for k, v in cast("Mapping[Any, Any]", event).items()}
    else:
        raw = {"detail": str(event)}
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if isinstance(value, str | int | float | bool) or value is None:
            out[name] = value
        elif isinstance(value, Mapping):
            typed: Mapping[str, Any] = value  # pyright: ignore[reportUnknownVariableType]
            out[name] = {k: v for k, v in typed.items() if isinstance(v, str | int | float | bool) or v is None}
    return out
