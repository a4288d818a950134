"""Chain verification: signatures against a trusted key set, hash links, seq and index order, blobs.

The core, ``verify_entries``, is sans-IO: it takes an iterable of ``StoredEntry`` (a store's
pages, a bundle, a fixture file), a ``TrustedKeys`` set and an optional blob lookup, and returns a
``VerifyReport`` (ok, counts, and the first bad entry with a stable reason code);
``report.raise_for_failure()`` (and ``check_entries``) is the raising form over the same result.
It streams: state is kept per session (last seq, last hash), never per entry, so a ledger of any
size verifies in bounded memory. The public entry point over a whole store, with the Merkle log
steps, is ``audit.verify`` (``truss.ledger.verify``).

The steps are numbered as in docs/ledger-format.md, section 4, and run in that order for each
entry; the first failing step names the reason:

  V1  parse: the fields of section 1 with their types (``malformed``)
  V2  the bytes are the canonical form of the entry (``not_canonical``)
  V3  the entry belongs to the expected log (``wrong_log``)
  V4  the stated hash is SHA-256 of the bytes (``hash_mismatch``)
  V5  the entry belongs to the session being verified (``foreign_session``)
  V6  seq follows the session's last seq, from 0 (``seq_gap``, ``reordered``, ``seq_duplicate``)
  V7  prev is the hash of the session's previous entry, or 64 zeros (``prev_mismatch``)
  V8  session_started first and only first, nothing after session_ended (``bad_start``, ``after_end``)
  V9  log index contiguous from 0 over the whole log, else increasing
      (``index_gap``, ``index_duplicate``, ``index_order``)
  V10 the signature verifies under a *trusted* key with the entry's key id
      (``untrusted_key``, ``bad_signature``)
  V11 every payload present hashes to its ref (``blob_mismatch``); absent ones are counted
  V12 extra per-entry checks a caller supplies (the Merkle leaf check plugs in here)
  V13 after the stream (``verify_ledger``): stored heads and the log size
      (``head_mismatch``, ``truncated``)
  V14 (whole log) every column of every session row is what its entries say (``row_mismatch``)
  V15 (whole log) each session read by its own columns is the chain the log holds
      (``session_index_mismatch``)

Structure is checked before the signature so that a reordered, removed, duplicated or spliced
entry (each validly signed) is named for what happened to it; any change to a signed byte that
leaves the structure intact is a ``bad_signature``.

``verify_ledger`` runs the same core over anything that reads like a store (``LedgerReader``)
and adds V13. It does no I/O itself. What this module does not do: Merkle roots, checkpoints,
bundles and verdict envelopes (``merkle``, ``note``, ``bundle``, ``envelope``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from truss._errors import NotFoundError, VerificationError
from truss._json import as_dict
from truss.ledger.canonical import CanonicalError, canonical, sha256_ref
from truss.ledger.entry import (
    ENTRY_FIELDS,
    ENTRY_VERSION,
    KINDS,
    ZERO_HASH,
    StoredEntry,
    entry_bytes,
    entry_signing_payload,
    iter_refs,
    refs_in,
    session_status,
)
from truss.ledger.keys import TrustedKeys

__all__ = [
    "REASONS",
    "BlobLookup",
    "EntryCheck",
    "EntryVerifier",
    "Finding",
    "LedgerReader",
    "SessionFacts",
    "SignatureChecks",
    "VerifyReport",
    "chain_link",
    "check_entries",
    "check_entry_alone",
    "failed_report",
    "row_mismatch",
    "verify_entries",
    "verify_ledger",
]

REASONS = frozenset(
    {
        "malformed",
        "not_canonical",
        "wrong_log",
        "hash_mismatch",
        "foreign_session",
        "seq_gap",
        "reordered",
        "seq_duplicate",
        "prev_mismatch",
        "bad_start",
        "after_end",
        "index_gap",
        "index_duplicate",
        "index_order",
        "untrusted_key",
        "bad_signature",
        "blob_mismatch",
        "head_mismatch",
        "row_mismatch",
        "session_index_mismatch",
        "node_mismatch",
        "bad_envelope",
        "truncated",
    }
)

Finding = tuple[str, str]
"""``(reason code, message)`` for a failed check."""

BlobLookup = Callable[[str], bytes | None]
RefsOf = Callable[[StoredEntry], Iterable[str]]
"""The refs an entry's body names, once each in order of first appearance (what V11 looks up)."""
EntryCheck = Callable[[StoredEntry], Finding | None]
"""A caller's extra per-entry check (V12): ``None`` when the entry passes."""


class SignatureChecks(Protocol):
    """V10's answers computed ahead of the step, elsewhere (a helper process at the edge): for a long
    read, the Ed25519 arithmetic of a page's entries runs on another core while this one does the
    other steps. The step itself stays where it is, in the same order: it takes a ``True`` answer
    for the very entry object it checks, and computes the signature check itself for anything else
    (no answer yet, the helper gone, or ``False``: a refusal is always found here)."""

    def submit(self, items: Sequence[StoredEntry], trusted: TrustedKeys) -> None:
        """Start checking ``items``' signatures under the keys ``trusted`` holds for their key ids."""
        ...

    def answer(self, item: StoredEntry) -> bool | None:
        """Whether ``item`` (an object given to ``submit``) is signed by a trusted key of its key id,
        or ``None`` when that is not known yet. Never waits."""
        ...

    def close(self) -> None:
        """Stop: nothing is checked or answered after this."""
        ...


_HEX64 = re.compile(r"[0-9a-f]{64}")
# How far past a seq gap to look for the missing entry before calling it a gap, not a reorder.
_REORDER_LOOKAHEAD = 4096
_PREFETCH = 256


@dataclass(frozen=True)
class VerifyReport:
    """The result of a verification: counts, and the first bad entry when ``ok`` is false."""

    ok: bool
    entries: int
    sessions: int
    blobs_checked: int = 0
    blobs_absent: int = 0
    reason: str | None = None
    message: str | None = None
    session: str | None = None
    seq: int | None = None
    index: int | None = None
    position: int | None = None
    head: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ok": self.ok,
            "entries": self.entries,
            "sessions": self.sessions,
            "blobs_checked": self.blobs_checked,
            "blobs_absent": self.blobs_absent,
        }
        if self.head is not None:
            out["head"] = self.head
        if not self.ok:
            out.update(
                reason=self.reason,
                message=self.message,
                session=self.session,
                seq=self.seq,
                index=self.index,
                position=self.position,
            )
        return out

    def raise_for_failure(self) -> VerifyReport:
        """This report when the ledger verified; else raise ``VerificationError`` (session, seq, index, reason)."""
        if not self.ok:
            raise self.error()
        return self

    def error(self) -> VerificationError:
        """The ``VerificationError`` this report describes (only meaningful when not ok)."""
        return VerificationError(
            self.message or "the ledger does not verify",
            remedy="do not trust this record; compare it with a bundle or checkpoint you hold",
            session=self.session,
            seq=self.seq,
            index=self.index,
            reason=self.reason,
        )


class _Chain:
    __slots__ = ("ended", "hash", "seq")

    def __init__(self) -> None:
        self.seq = -1
        self.hash = ZERO_HASH
        self.ended = False


class _Failed(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _where(entry: dict[str, Any]) -> str:
    return f"entry {entry.get('seq')!r} of session {entry.get('session')!r}"


def _parse(item: StoredEntry) -> None:
    """V1: the entry has exactly the fields of section 1, each of the right type."""
    entry = as_dict(item.entry)  # typed a dict, but read from a store or a bundle: anything
    if entry is None or entry.keys() != ENTRY_FIELDS:
        fields = sorted(entry) if entry is not None else []
        raise _Failed("malformed", f"an entry has fields {fields}, expected {sorted(ENTRY_FIELDS)}")
    problems: list[str] = []
    version: object = entry["v"]
    if type(version) is not int or version != ENTRY_VERSION:
        problems.append(f"v is {entry['v']!r}, not {ENTRY_VERSION}")
    for name in ("log", "session", "kind"):
        if type(entry[name]) is not str or not entry[name]:
            problems.append(f"{name} is not a non-empty string")
    for name in ("seq", "index", "ts"):
        value = entry[name]
        if type(value) is not int or value < 0:
            problems.append(f"{name} is not a non-negative integer")
    if entry["kind"] not in KINDS and type(entry["kind"]) is str:
        problems.append(f"kind {entry['kind']!r} is not a ledger entry kind")
    if type(entry["body"]) is not dict:
        problems.append("body is not an object")
    prev = entry["prev"]
    if type(prev) is not str or not _HEX64.fullmatch(prev):
        problems.append("prev is not 64 lower-case hex digits")
    if type(item.hash) is not str or type(item.keyid) is not str or type(item.sig) is not bytes:
        problems.append("hash, keyid or sig has the wrong type")
    if problems:
        raise _Failed("malformed", f"{_where(entry)}: " + "; ".join(problems))


class EntryVerifier:
    """Steps V1-V12 for one entry at a time, in stream order: what ``verify_entries`` and the
    verified reader (``truss.ledger.reader``) share, so there is one implementation of each step.

    ``check(item)`` returns ``None`` when the entry passes (and records it), else the finding of
    the first failing step; after a finding the verifier is not used again. ``lookahead`` is the
    rest of the stream, read only to tell a reorder from a gap (V6). ``refs`` gives the refs V11
    looks up for an entry whose body V1 found an object (default: walked from the body here); a
    reader that already walked each body to fetch its payloads hands the same lists over.
    ``signatures`` gives V10 answers computed ahead (``SignatureChecks``); without one, or without
    an answer for an entry, V10 checks the signature here.
    """

    def __init__(
        self,
        trusted: TrustedKeys,
        *,
        blobs: BlobLookup | None = None,
        session: str | None = None,
        origin: str | None = None,
        full_log: bool = False,
        extra: Sequence[EntryCheck] = (),
        refs: RefsOf | None = None,
        signatures: SignatureChecks | None = None,
    ) -> None:
        self._trusted = trusted
        self._signatures = signatures
        self._blobs = blobs
        self._refs = refs or _refs_of
        self._session = session
        self._origin = origin
        self._full_log = full_log
        self._extra = extra
        self.chains: dict[str, _Chain] = {}
        self.count = 0
        self.blobs_checked = 0
        self.blobs_absent = 0
        self.last_index = -1
        self.last_hash: str | None = None

    def check(self, item: StoredEntry, lookahead: Iterator[StoredEntry] | None = None) -> Finding | None:
        try:
            self._check(item, lookahead)
        except _Failed as failed:
            return failed.reason, failed.message
        return None

    def _check(self, item: StoredEntry, lookahead: Iterator[StoredEntry] | None) -> None:
        entry = item.entry
        _sound(item, self._origin)  # V1-V4
        session = self._session
        sid: str = entry["session"]
        if session is not None and sid != session:  # V5
            raise _Failed("foreign_session", f"{_where(entry)}: an entry of another session among those of {session!r}")
        seq: int = entry["seq"]
        chain = self.chains.get(sid)
        if chain is None:
            chain = self.chains[sid] = _Chain()
        expected = chain.seq + 1
        if seq != expected:
            if seq < expected:  # V6
                raise _Failed(
                    "seq_duplicate",
                    f"{_where(entry)}: seq {seq} again after seq {chain.seq} (a duplicated or replayed entry)",
                )
            # V6: a gap, unless the missing entry turns up next (then two entries were swapped).
            reason = "reordered" if lookahead is not None and _turns_up(lookahead, sid, expected) else "seq_gap"
            what = (
                f"entry {expected} comes after it (entries out of order)"
                if reason == "reordered"
                else f"entry {expected} is missing"
            )
            raise _Failed(reason, f"{_where(entry)}: expected seq {expected}; {what}")
        if entry["prev"] != chain.hash:  # V7
            before = f"entry {chain.seq}" if chain.seq >= 0 else "the zero hash of a first entry"
            raise _Failed("prev_mismatch", f"{_where(entry)}: prev hash does not match {before}")
        kind: str = entry["kind"]
        if (seq == 0) != (kind == "session_started"):  # V8
            raise _Failed(
                "bad_start", f"{_where(entry)}: a session starts with session_started, and only its first entry"
            )
        if chain.ended:
            raise _Failed("after_end", f"{_where(entry)}: an entry after the session ended")
        index: int = entry["index"]
        last_index = self.last_index
        if self._full_log and index != last_index + 1:  # V9
            if index <= last_index:
                raise _Failed("index_duplicate", f"{_where(entry)}: log index {index} again after {last_index}")
            raise _Failed("index_gap", f"{_where(entry)}: log index {index} after {last_index}; entries missing")
        if index <= last_index:
            raise _Failed("index_order", f"{_where(entry)}: log index {index} is not after {last_index}")
        _signed(item, self._trusted, self._signatures)  # V10
        if self._blobs is not None:  # V11
            for ref in self._refs(item):
                data = self._blobs(ref)
                if data is None:
                    self.blobs_absent += 1
                    continue
                self.blobs_checked += 1
                if sha256_ref(data) != ref:
                    raise _Failed("blob_mismatch", f"{_where(entry)}: the payload {ref[:19]}... was changed")
        for check in self._extra:  # V12
            finding = check(item)
            if finding is not None:
                raise _Failed(*finding)
        chain.seq, chain.hash = seq, item.hash
        chain.ended = kind == "session_ended"
        self.last_index = index
        self.last_hash = item.hash
        self.count += 1


def _refs_of(item: StoredEntry) -> Iterable[str]:
    return refs_in(item.entry["body"])


def chain_link(before: StoredEntry | None, item: StoredEntry) -> Finding | None:
    """V4, V6 and V7 of ``item`` against the entry it must follow (``before``; None: the session's
    first): for a holder of a chain's head that reads what was recorded after it (a run's journal),
    so that what it reads is the continuation of the head it holds, not of whatever the store holds."""
    entry = item.entry
    if hashlib.sha256(item.raw).hexdigest() != item.hash:
        return "hash_mismatch", f"{_where(entry)}: its stated hash is not the hash of its bytes"
    expected = before.seq + 1 if before is not None else 0
    if entry.get("seq") != expected:
        return "seq_gap", f"{_where(entry)}: expected seq {expected} after the head held"
    if entry.get("prev") != (before.hash if before is not None else ZERO_HASH):
        what = f"entry {before.seq} ({before.hash[:12]}...)" if before is not None else "the zero hash of a first entry"
        return "prev_mismatch", f"{_where(entry)}: prev hash does not match {what}, the head held"
    return None


def verify_entries(
    entries: Iterable[StoredEntry],
    trusted: TrustedKeys,
    *,
    blobs: BlobLookup | None = None,
    session: str | None = None,
    origin: str | None = None,
    full_log: bool = False,
    extra: Sequence[EntryCheck] = (),
) -> VerifyReport:
    """Verify a stream of entries; return a report naming the first bad one.

    ``session``: every entry must belong to it (V5). ``origin``: every entry's ``log`` (V3).
    ``full_log``: the stream is the whole log from index 0, so indexes are contiguous (V9);
    otherwise they only increase. ``blobs`` looks payload bytes up by ref (V11); an absent blob
    is counted (erased or never kept), not a failure. ``extra`` checks run last (V12).
    """
    verifier = EntryVerifier(trusted, blobs=blobs, session=session, origin=origin, full_log=full_log, extra=extra)
    stream = iter(entries)
    for position, item in enumerate(stream):
        finding = verifier.check(item, stream)
        if finding is not None:
            entry = item.entry
            raw_seq, raw_index, raw_session = entry.get("seq"), entry.get("index"), entry.get("session")
            return VerifyReport(
                ok=False,
                entries=verifier.count,
                sessions=len(verifier.chains),
                blobs_checked=verifier.blobs_checked,
                blobs_absent=verifier.blobs_absent,
                reason=finding[0],
                message=finding[1],
                session=raw_session if isinstance(raw_session, str) else None,
                seq=raw_seq if isinstance(raw_seq, int) else None,
                index=raw_index if isinstance(raw_index, int) else None,
                position=position,
            )
    return VerifyReport(
        ok=True,
        entries=verifier.count,
        sessions=len(verifier.chains),
        blobs_checked=verifier.blobs_checked,
        blobs_absent=verifier.blobs_absent,
        head=verifier.last_hash if len(verifier.chains) == 1 else None,
    )


def check_entry_alone(item: StoredEntry, trusted: TrustedKeys, *, origin: str) -> Finding | None:
    """V1-V4 and V10 for one entry read out of its chain (a range read): it is a well-formed,
    canonical entry of this log, signed by a trusted key. Its place in its chain is not checked."""
    try:
        _sound(item, origin)
        _signed(item, trusted)
    except _Failed as failed:
        return failed.reason, failed.message
    return None


def _sound(item: StoredEntry, origin: str | None) -> None:
    """V1-V4: a well-formed, canonical entry of the log ``origin`` (any log when None) whose
    stated hash is the hash of its bytes."""
    entry = item.entry
    _parse(item)  # V1
    # V2: the bytes that were hashed and signed are exactly the canonical form of the entry.
    try:
        canonical_ok = entry_bytes(entry) == item.raw
    except CanonicalError:
        canonical_ok = False
    if not canonical_ok:
        raise _Failed("not_canonical", f"{_where(entry)}: its bytes are not the canonical form of the entry")
    if origin is not None and entry["log"] != origin:  # V3
        raise _Failed("wrong_log", f"{_where(entry)}: belongs to log {entry['log']!r}, not {origin!r}")
    if hashlib.sha256(item.raw).hexdigest() != item.hash:  # V4
        raise _Failed("hash_mismatch", f"{_where(entry)}: its stated hash does not match its bytes")


def _signed(item: StoredEntry, trusted: TrustedKeys, signatures: SignatureChecks | None = None) -> None:
    """V10: signed by a key in ``trusted``, and the signature verifies (a ``True`` answer computed
    ahead by ``signatures`` for this entry is that check; anything else is checked here)."""
    if item.keyid not in trusted:
        raise _Failed(
            "untrusted_key", f"{_where(item.entry)}: signed by key {item.keyid!r}, which is not in the trusted set"
        )
    if signatures is not None and signatures.answer(item) is True:
        return
    if not trusted.verify(item.keyid, entry_signing_payload(item.raw), item.sig):
        raise _Failed("bad_signature", f"{_where(item.entry)}: the signature does not verify")


def _turns_up(stream: Iterator[StoredEntry], session: str, seq: int) -> bool:
    """Whether the next entries of ``session`` (within a bounded lookahead) include ``seq``."""
    for n, item in enumerate(stream):
        if n >= _REORDER_LOOKAHEAD:
            return False
        if item.entry.get("session") == session:
            return item.entry.get("seq") == seq
    return False


def check_entries(
    entries: Iterable[StoredEntry],
    trusted: TrustedKeys,
    *,
    blobs: BlobLookup | None = None,
    session: str | None = None,
    origin: str | None = None,
    full_log: bool = False,
    extra: Sequence[EntryCheck] = (),
) -> VerifyReport:
    """``verify_entries`` that raises ``VerificationError`` (with session, seq, index, reason)."""
    report = verify_entries(
        entries, trusted, blobs=blobs, session=session, origin=origin, full_log=full_log, extra=extra
    )
    return report.raise_for_failure()


class LedgerReader(Protocol):
    """The reading half of a ledger store: what ``verify_ledger`` needs."""

    origin: str

    def session(self, session: str) -> Any: ...
    def sessions(self, *, status: str | None = None, limit: int | None = None, principal: Any = None) -> Any: ...
    def read_session(self, session: str, *, from_seq: int = 0) -> Iterator[StoredEntry]: ...
    def read_range(self, start: int, stop: int) -> Iterator[StoredEntry]: ...
    def blob(self, ref: str) -> bytes | None: ...
    def blobs_for(self, refs: Iterable[str]) -> dict[str, bytes]: ...
    def tree_size(self) -> int: ...


def verify_ledger(
    store: LedgerReader,
    trusted: TrustedKeys,
    *,
    session: str | None = None,
    payloads: bool = True,
    extra: Sequence[EntryCheck] = (),
) -> VerifyReport:
    """Verify one session, or (``session=None``) the whole log, as a store holds it.

    Runs V1-V12 over the stored entries, then V13: each session's stored head and entry count
    equal what the chain ends with (a truncated session is caught even though every remaining
    entry verifies), and the whole log holds exactly ``tree_size()`` entries.
    Raises ``NotFoundError`` for an unknown session.
    """
    held: dict[str, bytes] = {}
    blob_lookup = held.get if payloads else None

    def prefetched(entries: Iterator[StoredEntry]) -> Iterator[StoredEntry]:
        # One query for the payloads of a page of entries instead of one per payload.
        if not payloads:
            yield from entries
            return
        page: list[StoredEntry] = []
        for item in entries:
            page.append(item)
            if len(page) == _PREFETCH:
                held.clear()
                held.update(store.blobs_for(ref for e in page for ref in iter_refs(e.entry.get("body"))))
                yield from page
                page = []
        held.clear()
        held.update(store.blobs_for(ref for e in page for ref in iter_refs(e.entry.get("body"))))
        yield from page

    if session is not None:
        info: Any = store.session(session)
        if info is None:
            raise NotFoundError(
                f"no session {session!r} in this ledger",
                remedy="list sessions with `truss ledger list`",
                what="session",
                name=session,
            )
        heads: Mapping[str, tuple[int, str]] = {session: (int(info.entries), str(info.head))}
        report = verify_entries(
            prefetched(store.read_session(session)),
            trusted,
            blobs=blob_lookup,
            session=session,
            origin=store.origin,
            extra=extra,
        )
        return _check_heads(report, heads, counts={session: report.entries} if report.ok else {})
    size = store.tree_size()
    seen: dict[str, _Tally] = {}

    def tracked() -> Iterator[StoredEntry]:
        for item in prefetched(store.read_range(0, size)):
            sid = str(item.entry.get("session"))
            tally = seen.get(sid)
            if tally is None:
                tally = seen[sid] = _Tally(item)
            tally.add(item)
            yield item

    report = verify_entries(tracked(), trusted, blobs=blob_lookup, origin=store.origin, full_log=True, extra=extra)
    if not report.ok:
        return report
    if report.entries != size:
        return failed_report(report, "truncated", f"the log should hold {size} entries but {report.entries} were read")
    rows: Sequence[Any] = store.sessions()
    for row in rows:
        tally = seen.pop(row.id, None)
        if tally is None or tally.count != row.entries or tally.last.hash != row.head:
            read = 0 if tally is None else tally.count
            return failed_report(
                report,
                "head_mismatch",
                f"session {row.id!r}: the store lists {row.entries} entries ending at {row.head[:12]}..., "
                f"the log holds {read}",
                session=row.id,
            )
        column = row_mismatch(row, SessionFacts.of(tally.first, tally.last))
        if column is not None:  # V14: every column of the session row is what its chain says
            return failed_report(
                report,
                "row_mismatch",
                f"session {row.id!r}: the stored {column} is not what its signed entries say",
                session=row.id,
            )
        # V15: the session read on its own (by its seq and session columns) is the same chain.
        order = hashlib.sha256()
        for item in store.read_session(row.id):
            order.update(item.hash.encode("ascii", "replace"))
        if order.digest() != tally.order.digest():
            return failed_report(
                report,
                "session_index_mismatch",
                f"session {row.id!r}: read by session and seq, the store returns other entries than the log holds",
                session=row.id,
            )
    if seen:
        orphan = next(iter(seen))
        return failed_report(
            report, "head_mismatch", f"session {orphan!r} has entries but no session record", session=orphan
        )
    return report


class _Tally:
    """What the whole-log pass keeps per session: its first and last entry, count, and hash order."""

    __slots__ = ("count", "first", "last", "order")

    def __init__(self, first: StoredEntry) -> None:
        self.first = first
        self.last = first
        self.count = 0
        self.order = hashlib.sha256()

    def add(self, item: StoredEntry) -> None:
        self.last = item
        self.count += 1
        self.order.update(item.hash.encode("ascii", "replace"))


@dataclass(frozen=True)
class SessionFacts:
    """What a session's signed entries say about it: the values of its (unsigned) session row.

    From its first entry: ``contract``, ``principal`` (canonical JSON text, or None) and
    ``started_ms``; from its last: ``entries``, ``head``, ``updated_ms``, ``ended`` and ``status``
    (``entry.status_after``). A reader derives a session's listing from these; ``verify_ledger``
    checks each stored row against them (V13).
    """

    id: str
    contract: str | None
    principal: str | None
    status: str
    entries: int
    started_ms: int
    updated_ms: int
    head: str
    ended: bool

    @classmethod
    def of(cls, first: StoredEntry, last: StoredEntry) -> SessionFacts:
        body = first.body
        contract = body.get("contract") if first.kind == "session_started" else None
        principal = body.get("principal") if first.kind == "session_started" else None
        return cls(
            id=last.session,
            contract=contract if isinstance(contract, str) else None,
            principal=None if principal is None else canonical(principal).decode("utf-8"),
            status=session_status(last.session, last.kind, last.body),
            entries=last.seq + 1,
            started_ms=first.ts,
            updated_ms=last.ts,
            head=last.hash,
            ended=last.kind == "session_ended",
        )


def row_mismatch(row: Any, facts: SessionFacts) -> str | None:
    """The first column of a stored session row that differs from what its entries say, or None."""
    principal: Any = getattr(row, "principal", None)
    try:
        stored_principal = None if principal is None else canonical(principal).decode("utf-8")
    except CanonicalError:
        return "principal"
    pairs: tuple[tuple[str, Any, Any], ...] = (
        ("contract", getattr(row, "contract", None), facts.contract),
        ("principal", stored_principal, facts.principal),
        ("status", getattr(row, "status", None), facts.status),
        ("entry count", getattr(row, "entries", None), facts.entries),
        ("start time", getattr(row, "started_ms", None), facts.started_ms),
        ("update time", getattr(row, "updated_ms", None), facts.updated_ms),
        ("head", getattr(row, "head", None), facts.head),
        ("ended flag", getattr(row, "ended", None), facts.ended),
    )
    for name, stored, derived in pairs:
        if stored != derived or type(stored) is not type(derived):
            return name
    return None


def _check_heads(report: VerifyReport, heads: Mapping[str, tuple[int, str]], counts: Mapping[str, int]) -> VerifyReport:
    if not report.ok:
        return report
    for sid, (entries, head) in heads.items():
        if counts.get(sid) != entries or (entries and report.head != head):
            return failed_report(
                report,
                "head_mismatch",
                f"session {sid!r}: the store lists {entries} entries ending at {head[:12]}..., "
                f"the chain holds {counts.get(sid, 0)}" + (f" ending at {report.head[:12]}..." if report.head else ""),
                session=sid,
            )
    return report


def failed_report(report: VerifyReport, reason: str, message: str, *, session: str | None = None) -> VerifyReport:
    """``report``'s counts, failed for ``reason``: a finding of a check that runs once the entries
    verified (V13-V15 here, the log checks of ``audit``)."""
    return VerifyReport(
        ok=False,
        entries=report.entries,
        sessions=report.sessions,
        blobs_checked=report.blobs_checked,
        blobs_absent=report.blobs_absent,
        reason=reason,
        message=message,
        session=session,
    )
