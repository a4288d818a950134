"""``truss status``: what an operator must look at, from the ledger alone.

``operator_status(store, now_ms=)`` lists the **unfinished sessions** (running, interrupted,
suspended waiting for an approval, a signal, an asynchronous tool or a resolution of a call in
doubt, diverged), each with what it waits on and the command that moves it on, and **every
quota's use** in its window (``truss.quota``): what counts, the sessions whose unsettled
reservations hold it, the limits in force at its latest reservation and when its oldest settled
use leaves the window.

It only reads, through whatever store it is given (the ``Runtime``'s verified reader in the
CLI), and takes no session's lease: a run in progress is never blocked by it, and it never
changes a session. What it does not do: render (the CLI does), read the operator config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from truss._quota_book import quota_book, quota_use
from truss.durable import in_doubt_calls
from truss.ledger.entry import StoredEntry
from truss.ledger.keyhistory import is_log_session
from truss.ledger.stores.base import LedgerStore
from truss.session import TERMINAL, pending_approvals, pending_signals

__all__ = ["UnfinishedSession", "operator_status"]


@dataclass(frozen=True)
class UnfinishedSession:
    """One session that has not ended, what it waits on, and how to move it on."""

    session: str
    status: str
    contract: str | None
    principal: Any
    started_ms: int
    updated_ms: int
    waiting_on: str | None  # approval, in_doubt, signal, task, interrupted, diverged; None: running
    calls: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    owner: dict[str, Any] | None = None  # who drives a running session (its lease), when known
    detail: str | None = None
    extra: dict[str, Any] = field(default_factory=dict[str, Any])

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "status": self.status,
            "contract": self.contract,
            "principal": self.principal,
            "started_ms": self.started_ms,
            "updated_ms": self.updated_ms,
            "waiting_on": self.waiting_on,
            "calls": list(self.calls),
            "commands": list(self.commands),
            "owner": self.owner,
            "detail": self.detail,
        }


def _pending_tasks(entries: list[StoredEntry]) -> list[str]:
    settled = {str(e.body.get("call")) for e in entries if e.kind == "mcp_tool_call"}
    return [
        str(e.body.get("call"))
        for e in entries
        if e.kind == "mcp_tool_pending" and e.body.get("kind") != "signal" and str(e.body.get("call")) not in settled
    ]


def _describe(store: LedgerStore, info: Any) -> UnfinishedSession:
    session = str(info.id)
    base: dict[str, Any] = {
        "session": session,
        "status": str(info.status),
        "contract": info.contract,
        "principal": info.principal,
        "started_ms": int(info.started_ms),
        "updated_ms": int(info.updated_ms),
    }
    if info.status == "running":  # driven now (the verified reader says ``interrupted`` once its owner is gone)
        return UnfinishedSession(**base, waiting_on=None, owner=_owner(store, session))
    entries = list(store.read_session(session))
    approvals = pending_approvals(entries)
    if approvals:
        commands = tuple(f"truss approve {session} {c}   (or --deny)" for c in approvals)
        return UnfinishedSession(**base, waiting_on="approval", calls=tuple(approvals),
                                 commands=(*commands, f"truss resume {session}"))  # fmt: skip
    doubt = list(in_doubt_calls(entries))  # the calls `truss resolve` settles
    if doubt:
        commands = tuple(f"truss resolve {session} {c} --result JSON | --failed REASON | --not-sent" for c in doubt)
        return UnfinishedSession(**base, waiting_on="in_doubt", calls=tuple(doubt),
                                 commands=(*commands, f"truss resume {session}"))  # fmt: skip
    signals = pending_signals(entries)
    if signals:
        commands = tuple(f"truss signal {session} {name} --payload JSON" for name in signals.values())
        return UnfinishedSession(**base, waiting_on="signal", calls=tuple(signals),
                                 commands=(*commands, f"truss resume {session}"))  # fmt: skip
    tasks = _pending_tasks(entries)
    if tasks:
        return UnfinishedSession(**base, waiting_on="task", calls=tuple(tasks),
                                 commands=(f"truss resume {session}",),
                                 detail="an asynchronous tool call has not finished; resume polls it")  # fmt: skip
    if info.status == "diverged":
        detail = "the resumed run asked for something its record does not hold; start a new run"
        return UnfinishedSession(**base, waiting_on="diverged", commands=(f"truss replay {session}",),
                                 detail=detail)  # fmt: skip
    suspended = next((e.body for e in reversed(entries) if e.kind == "session_suspended"), None)
    reason = str(suspended.get("reason")) if suspended is not None else "interrupted"
    return UnfinishedSession(**base, waiting_on=reason if reason != "approval" else "interrupted",
                             commands=(f"truss resume {session}",))  # fmt: skip


def _owner(store: LedgerStore, session: str) -> dict[str, Any] | None:
    """Who drives a running session: its lease (coordination, not evidence: it is not signed)."""
    lease = store.lease(session)
    return None if lease is None else lease.to_json()


def operator_status(store: LedgerStore, *, now_ms: int, limit: int | None = None) -> dict[str, Any]:
    """Unfinished sessions (newest first, at most ``limit``) and every quota's use at ``now_ms``."""
    unfinished: list[UnfinishedSession] = []
    for info in store.sessions():
        if is_log_session(info.id) or info.ended or info.status in TERMINAL:
            continue
        unfinished.append(_describe(store, info))
        if limit is not None and len(unfinished) >= limit:
            break
    book = quota_book(store)
    return {
        "now_ms": book.stamp(now_ms),
        "unfinished": [u.to_json() for u in unfinished],
        "quotas": [q.to_json() for q in quota_use(book, now_ms)],
    }
