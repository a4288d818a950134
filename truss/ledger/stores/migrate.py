"""``truss ledger migrate``: copy a ledger into an empty PostgreSQL ledger, verifying on the way.

The copy keeps every entry's bytes and signature (nothing is re-signed, so it verifies with the
same keys). The source is read once, in log order, through the one verification
(``verify_ledger`` with the Merkle audit of ``truss ledger verify --all``): each entry is copied
only after its checks passed, into one target transaction. Everything else is read through the
verified reader's rules (``truss.ledger.reader.VerifiedStore``): payload bytes only when they hash
to their ref (R5); session rows as their signed first and last entries say (R3: status, head,
counts and times are derived, never the stored columns); a verdict envelope only when it opens
under the trusted keys for that session's verified head and status (R4). If any check fails (a
bad signature, a broken chain, a checkpoint that does not match the tree, a changed payload, a
forged envelope, a session row its entries contradict), the transaction is rolled back and the
target is left as it was. Checkpoints follow; then the copy is verified again as it is stored.
Leases are not copied: a session that was running in the source has no owner in the copy.

What it does not do: merge into a ledger that holds entries, or re-sign with another key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from truss._clock import Clock
from truss._errors import VerificationError
from truss.ledger.audit import LogAudit, verify_store
from truss.ledger.entry import StoredEntry
from truss.ledger.keys import TrustedKeys
from truss.ledger.reader import VerifiedStore
from truss.ledger.stores.base import LedgerStore
from truss.ledger.stores.postgresql import LedgerImport, PostgresStore, parse_postgres_url
from truss.ledger.verification import verify_ledger

__all__ = ["MigrateReport", "migrate_ledger", "open_target"]

_PAGE = 500


@dataclass(frozen=True)
class MigrateReport:
    """What was copied, as the verified copy holds it."""

    entries: int
    sessions: int
    checkpoints: int
    blobs: int
    tree_size: int
    root: str

    def to_json(self) -> dict[str, Any]:
        return {
            "entries": self.entries,
            "sessions": self.sessions,
            "checkpoints": self.checkpoints,
            "blobs": self.blobs,
            "tree_size": self.tree_size,
            "root": self.root,
        }


def open_target(url: str, *, origin: str, clock: Clock) -> PostgresStore:
    """The PostgreSQL ledger ``url`` names, created (without a key) as the log ``origin`` if absent."""
    return PostgresStore(parse_postgres_url(url), key=None, clock=clock, origin=origin)


def migrate_ledger(source: LedgerStore, target: PostgresStore, trusted: TrustedKeys) -> MigrateReport:
    """Copy ``source`` into the empty ``target``, verifying every entry with ``trusted`` on the way.

    Raises ``VerificationError`` (nothing written) when the source does not verify, and
    ``StoreConflictError`` when the target is not empty or is another log.
    """
    if target.origin != source.origin:
        raise VerificationError(
            f"the target ledger is the log {target.origin!r}, the source is {source.origin!r}",
            remedy="migrate into a new, empty ledger",
            reason="wrong_log",
        )
    verified = VerifiedStore(source, trusted)
    checkpoints = source.checkpoints()
    audit = LogAudit(checkpoints, trusted, source.origin, node=source.node)
    erased: dict[str, set[str]] = {}
    page: list[StoredEntry] = []

    def copy_page(sink: LedgerImport) -> None:
        held = verified.blobs_for(ref for item in page for ref in item.refs())
        for item in page:
            gone = erased.get(item.session)
            if gone is None:
                gone = erased[item.session] = source.erased_refs(item.session)
            sink.entry(item, {ref: held[ref] for ref in item.refs() if ref in held and ref not in gone})
        page.clear()

    with target.importing() as sink:

        def copy(item: StoredEntry) -> tuple[str, str] | None:
            page.append(item)  # every check before this one passed: the entry verified
            if len(page) >= _PAGE:
                copy_page(sink)
            return None

        report = verify_ledger(source, trusted, extra=[audit.check, copy])
        if not report.ok:
            raise report.error()
        copy_page(sink)
        size, root = source.tree_head()
        problem = audit.finish(size, root)
        if problem is not None:
            raise VerificationError(
                f"the source's Merkle log does not check out: {problem[1]}",
                remedy="run `truss ledger verify --all` on the source; nothing was copied",
                reason=problem[0],
            )
        for info in verified.sessions():
            sink.session(info, envelope=verified.envelope(info.id), erased=source.erased_refs(info.id))
        for checkpoint in checkpoints:
            sink.checkpoint(checkpoint)
    after = verify_store(target, trusted)
    if not after.ok:
        raise VerificationError(
            f"the copy does not verify: {after.message}",
            remedy="report this as a bug; the source is unchanged",
            reason=after.reason,
        )
    size, root = target.tree_head()
    return MigrateReport(
        entries=sink.entries,
        sessions=sink.sessions,
        checkpoints=sink.checkpoints,
        blobs=sink.blobs,
        tree_size=size,
        root=root.hex(),
    )
