"""Every read telemetry makes of a ledger store, in one place.

The after-the-fact export reads one session (``recorded_session``: its entries after the session
verifies, and the payloads it still holds); the live exporter reads one call's stored payloads,
off the run's event loop (``call_content``). Nothing else in ``truss.telemetry`` touches a store,
so routing every read through one verified reader later changes this module only.

What it reads are the bytes the ledger stores: arguments and results after the gate's redactor
replaced ``secret_args`` fields and scrubbed known secret values, never the live values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from truss._errors import NotFoundError, VerificationError
from truss.ledger.audit import verify
from truss.ledger.entry import StoredEntry, iter_refs
from truss.ledger.keys import TrustedKeys
from truss.telemetry.spans import Content, content_attributes

__all__ = ["RecordedSession", "call_content", "recorded_session"]


@dataclass(frozen=True)
class RecordedSession:
    """One verified session: its entries in seq order, its log's origin, and the payloads still held."""

    session: str
    origin: str
    entries: list[StoredEntry]
    blobs: dict[str, bytes] = field(default_factory=dict[str, bytes])

    def blob(self, ref: str) -> bytes | None:
        return self.blobs.get(ref)


def recorded_session(store: Any, session: str, trusted: TrustedKeys, *, payloads: bool) -> RecordedSession:
    """``session`` as ``store`` holds it, once it verifies against ``trusted``.

    Raises ``NotFoundError`` for an unknown session and ``VerificationError`` (exit 1) when the
    session does not verify: spans of a record that was changed would vouch for what it now says.
    ``payloads``: also read (and verify) the argument and result bytes it still holds.
    """
    if store.session(session) is None:
        raise NotFoundError(
            f"no session {session!r} in this ledger",
            remedy="list sessions with `truss ledger list`",
            what="session",
            name=session,
        )
    # The one verification `truss ledger verify` makes: the chain, the key history, the checkpoints.
    report = verify(store, trusted, session=session, payloads=payloads)
    if not report.ok:
        raise VerificationError(
            f"session {session} does not verify ({report.reason}): {report.message}; nothing was exported",
            remedy=f"run `truss ledger verify {session}` for the details",
            reason=report.reason,
            session=session,
        )
    entries: list[StoredEntry] = list(store.read_session(session))
    blobs: dict[str, bytes] = {}
    if payloads:
        erased: set[str] = store.erased_refs(session)
        refs = {ref for e in entries for ref in iter_refs(e.body)} - erased
        blobs = store.blobs_for(refs)
    return RecordedSession(session, str(store.origin), entries, blobs)


def call_content(store: Any, index: int, content: Content) -> dict[str, str]:
    """The opted-in payload attributes of the call whose last entry is at log ``index``.

    Runs in the exporter's thread (a store is safe to read from any thread). A missing entry or
    an erased payload gives nothing.
    """
    entries: list[StoredEntry] = list(store.read_range(index, index + 1))
    if not entries:
        return {}
    reader: Callable[[str], bytes | None] = store.blob
    return content_attributes(entries[0].body, reader, content)
