"""Retention: erase the payloads of sessions that ended longer ago than ``[harness] keep``.

``sweep(store, keep_ms=, now_ms=)`` removes the argument, result and model-turn bytes of every
session whose ``session_ended`` entry is older than ``keep_ms``, exactly as ``truss ledger erase``
does one session: the entries keep their payload hashes, so every swept session still verifies
and ``truss ledger show`` marks its payloads erased. It is what ``truss ledger sweep`` runs, and
serve-mcp at its start and once a day.

Never swept: a session that has not ended (running, interrupted, waiting for approval, a signal or
a task, in doubt, diverged: its payloads are what a resume replays), a session whose quota
reservation is not settled (``truss.quota``: its use is still being accounted), the log-level
sessions (``@log``, ``@quota``: they hold no payloads and are the log's own record), and a session
already swept (payloads already erased).

The age is read from the signed ``session_ended`` entry's ``ts``, not from the store's unsigned
session row (through the verified reader, its listing already verified that entry). What it does
not do: delete entries (nothing is ever removed from the chain), or read the operator config
(callers pass ``keep_ms``: ``truss.contract.keep_ms``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from truss._quota_book import quota_book
from truss.ledger.keyhistory import is_log_session
from truss.ledger.stores.base import LedgerStore, SessionInfo

__all__ = ["SweepReport", "sweep"]


@dataclass
class SweepReport:
    """What a sweep did: the sessions swept (with the payloads erased) and why others were kept."""

    keep_ms: int | None
    cutoff_ms: int | None
    swept: dict[str, int] = field(default_factory=dict[str, int])
    unfinished: list[str] = field(default_factory=list[str])
    holding_quota: list[str] = field(default_factory=list[str])
    recent: int = 0
    already: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "keep_ms": self.keep_ms,
            "cutoff_ms": self.cutoff_ms,
            "swept": [{"session": s, "erased": n} for s, n in sorted(self.swept.items())],
            "kept_unfinished": sorted(self.unfinished),
            "kept_holding_quota": sorted(self.holding_quota),
            "kept_recent": self.recent,
            "already_swept": self.already,
        }


def sweep(store: LedgerStore, *, keep_ms: int | None, now_ms: int, dry_run: bool = False) -> SweepReport:
    """Erase the payloads of sessions ended before ``now_ms - keep_ms`` (None: keep forever: nothing)."""
    if keep_ms is None:
        return SweepReport(keep_ms=None, cutoff_ms=None)
    cutoff = now_ms - keep_ms
    report = SweepReport(keep_ms=keep_ms, cutoff_ms=cutoff)
    held = {r.session for r in quota_book(store).unsettled()}
    for info in store.sessions():
        if is_log_session(info.id):
            continue
        if not info.ended:
            report.unfinished.append(info.id)
            continue
        if info.id in held:
            report.holding_quota.append(info.id)
            continue
        ended_ms = _ended_ms(store, info)
        if ended_ms is None or ended_ms > cutoff:
            report.recent += 1
            continue
        if store.erased_refs(info.id):
            report.already += 1
            continue
        report.swept[info.id] = 0 if dry_run else store.erase_payloads(info.id)
    return report


def _ended_ms(store: LedgerStore, info: SessionInfo) -> int | None:
    """When an ended session's signed ``session_ended`` entry was written.

    A row from the verified reader (``info.verified``) was checked at its last entry, which is that
    entry (``ended``), and carries its time as ``updated_ms``: reading the session again would verify
    all of it, for every ended session at every sweep. A row read from a store directly is not
    trusted: its last entry is read."""
    if info.verified is not None:
        return info.updated_ms
    last = list(store.read_session(info.id, from_seq=max(0, info.entries - 1)))
    ended = next((e for e in reversed(last) if e.kind == "session_ended"), None)
    return None if ended is None else ended.ts
