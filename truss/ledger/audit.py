"""Auditing a store: its Merkle log and checkpoints against its entries, and the one ``verify``.

``verify(evidence, trusted)`` is the public form of every check an auditor runs (``truss.ledger.verify``):

- over a store (``LedgerStore``, or anything that reads like one): the entries' chain steps
  V1-V13 (``verification``), and the log steps L1-L5 for the whole log (``LogAudit``) or L6 for one
  ``session`` (``SessionInLog``): exactly what ``truss ledger verify`` checks; returns a
  ``VerifyReport``;
- over ``bytes``: an exported bundle, steps B1-B8 (``bundle.verify_bundle``); returns a
  ``BundleReport``.

Each report has ``raise_for_failure()``, the raising form over the same result. ``verify_since``
proves that a store's log only grew since a checkpoint an auditor kept (S1-S4).

Sans-IO: stores are reached through the small protocols below. Only ``trusted`` decides which
keys count; nothing a store or bundle says about its own keys is taken on trust.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, overload

from truss._errors import InputError, StoreError, TrussError, UsageError, VerificationError
from truss.ledger.canonical import CanonicalError
from truss.ledger.entry import StoredEntry, entry_bytes
from truss.ledger.keyhistory import LOG_SESSION, KeyHistory, follow_rotations, log_entries
from truss.ledger.keys import TrustedKeys, VerifierKey
from truss.ledger.merkle import (
    Frontier,
    GetNodes,
    LeafProver,
    NodeHashes,
    consistency_nodes,
    consistency_proof,
    fetched,
    in_order,
    inclusion_nodes,
    inclusion_proof,
    leaf_hash,
    leaves_nodes,
    root_at,
    root_nodes,
    root_with_leaves,
    verify_consistency,
    verify_inclusion,
)
from truss.ledger.note import Checkpoint, StoredCheckpointLike, open_checkpoint, parse_checkpoint, parse_note
from truss.ledger.verification import EntryCheck, LedgerReader, VerifyReport, failed_report, verify_ledger

if TYPE_CHECKING:  # bundles and witness policies load only when verified (start-up of `ledger verify`)
    from truss.ledger.bundle import BundleReport

__all__ = [
    "AuditSource",
    "LogAudit",
    "SessionInLog",
    "SinceReport",
    "SinceSource",
    "head_index",
    "session_in_log",
    "store_key_history",
    "stored_checkpoint_signers",
    "verify",
    "verify_since",
    "verify_store",
]


class AuditSource(LedgerReader, Protocol):
    """What ``verify`` reads from a store: its entries (``LedgerReader``), checkpoints and Merkle nodes."""

    def checkpoints(self) -> Sequence[StoredCheckpointLike]: ...

    def latest_checkpoint(self) -> StoredCheckpointLike | None: ...

    def checkpoint_covering(self, size: int) -> StoredCheckpointLike | None: ...

    def node(self, level: int, index: int) -> bytes: ...

    def nodes(self, keys: Sequence[tuple[int, int]]) -> Mapping[tuple[int, int], bytes]: ...

    def node_hashes(self, keys: Iterable[tuple[int, int]]) -> Iterable[bytes]: ...


@overload
def verify(evidence: bytes, trusted: TrustedKeys | Iterable[VerifierKey]) -> BundleReport: ...


@overload
def verify(
    evidence: AuditSource,
    trusted: TrustedKeys | Iterable[VerifierKey],
    *,
    session: str | None = None,
    payloads: bool = True,
) -> VerifyReport: ...


def verify(
    evidence: AuditSource | bytes,
    trusted: TrustedKeys | Iterable[VerifierKey],
    *,
    session: str | None = None,
    payloads: bool = True,
) -> VerifyReport | BundleReport:
    """Verify a store (the whole log, or one ``session``) or an exported bundle (``bytes``).

    Never raises for tampered or malformed evidence: the report says what failed, where and why
    (``report.raise_for_failure()`` raises it instead). ``trusted`` are the verifier keys the
    auditor trusts; ``payloads=False`` skips re-hashing stored payloads. ``NotFoundError`` for a
    ``session`` the store does not hold.
    """
    keys = trusted if isinstance(trusted, TrustedKeys) else TrustedKeys(trusted)
    if isinstance(evidence, bytes | bytearray | memoryview):
        if session is not None or not payloads:
            raise UsageError(
                "a bundle is verified whole: session= and payloads= apply to a store",
                remedy="call verify(bundle_bytes, trusted)",
            )
        from truss.ledger.bundle import verify_bundle

        return verify_bundle(bytes(evidence), keys)
    return verify_store(evidence, keys, session=session, payloads=payloads)


def verify_store(
    store: AuditSource, trusted: TrustedKeys, *, session: str | None = None, payloads: bool = True
) -> VerifyReport:
    """V1-V13 over the stored entries with L1-L5 (whole log) or L6 (``session``) plugged in as V12.

    The key history in the log's own session (key rotations) is followed from ``trusted`` first:
    entries and checkpoints signed by a later key verify, each within the span its key was current.
    """
    # A verified reader (``truss.ledger.reader``) is verified through the store it wraps: these
    # checks are what its reads rest on.
    store = getattr(store, "raw", store)
    history = store_key_history(store, trusted)
    if isinstance(history, VerifyReport):
        return history
    trusted = history.trusted
    extra: list[EntryCheck] = []
    audit: LogAudit | None = None
    used: list[StoredCheckpointLike] = []
    if session is None:
        audit = LogAudit(store.checkpoints(), trusted, store.origin, node=store.node)
        extra.append(audit.check)
    else:
        in_log, used = session_in_log(store, trusted)
        extra.append(in_log.check)
    if history.rotations:
        extra.append(history.check)
    report = verify_ledger(store, trusted, session=session, payloads=payloads, extra=extra)
    if audit is None or not report.ok:
        return stored_checkpoint_signers(store, history, report, checkpoints=used if session is not None else None)
    # The tree as of the entries just verified: appends that land meanwhile are not this run's.
    size = audit.frontier.size
    try:
        finding = audit.finish(size, root_at(size, fetched(store.nodes, root_nodes(size))))
        if finding is None:  # L5: the frontier the store appends from is the rebuilt tree's
            finding = audit.finish(*_stored_head(store))
    except StoreError as exc:
        finding = ("tree_mismatch", exc.message)
    if finding is None:
        finding = _envelopes_match(store, history)  # L7
    if finding is None:
        return stored_checkpoint_signers(store, history, report)
    return failed_report(report, *finding)


def _stored_head(store: AuditSource) -> tuple[int, bytes]:
    head: Callable[[], tuple[int, bytes]] | None = getattr(store, "tree_head", None)
    if head is None:
        return store.tree_size(), getattr(store, "tree_root", lambda: b"")()
    return head()


def _envelopes_match(store: AuditSource, history: KeyHistory) -> tuple[str, str] | None:
    """L7: every stored verdict envelope is signed by a trusted key (after a rotation, one that signs
    at its session's last entry, as B7), names its session and that session's head, and gives the
    status its ``session_ended`` entry records."""
    read: Callable[[str], bytes | None] | None = getattr(store, "envelope", None)
    if read is None:
        return None
    for row in store.sessions():
        data = read(row.id)
        if data is None:
            continue
        try:
            at = functools.partial(head_index, store, row.id, int(row.entries), row.head)
            verdict = history.open_verdict(data, session=row.id, head=row.head, head_index=at)
        except (VerificationError, InputError) as exc:
            reason = "retired_key" if exc.fields.get("reason") == "retired_key" else "bad_envelope"
            return reason, f"session {row.id!r}: its stored verdict envelope does not verify ({exc.message})"
        if verdict.status != row.status:
            return (
                "bad_envelope",
                f"session {row.id!r}: its verdict envelope says {verdict.status}, its end {row.status}",
            )
    return None


def head_index(store: LedgerReader, session: str, entries: int, head: str) -> int:
    """The log index of ``session``'s last entry (its seq ``entries - 1``), whose hash is ``head`` (a
    verified head): the entry stored there is read and its bytes hashed, so the index is the one
    that head signs. ``VerificationError`` (``head_mismatch``) when the store holds another entry there."""
    item = next(iter(store.read_session(session, from_seq=max(0, entries - 1))), None) if entries else None
    if item is not None:
        try:
            bound = entry_bytes(item.entry) == item.raw and hashlib.sha256(item.raw).hexdigest() == head
        except CanonicalError:
            bound = False
        if bound and isinstance(item.entry.get("index"), int):
            return item.index
    raise VerificationError(
        f"session {session!r}: the entry its verified head {head[:12]}... names is not stored as its last entry",
        remedy="run `truss ledger verify --all`; the store changed under the read",
        reason="head_mismatch",
        session=session,
    )


def store_key_history(store: LedgerReader, trusted: TrustedKeys) -> KeyHistory | VerifyReport:
    """The key history in the store's ``@log`` session followed from ``trusted``, or a failing report."""
    try:
        return follow_rotations(log_entries(store), trusted, origin=store.origin)
    except VerificationError as exc:
        return VerifyReport(
            ok=False,
            entries=0,
            sessions=0,
            reason=str(exc.fields.get("reason")),
            message=exc.message,
            session=LOG_SESSION,
            seq=exc.fields.get("seq"),
            index=exc.fields.get("index"),
        )


def stored_checkpoint_signers(
    store: AuditSource,
    history: KeyHistory,
    report: VerifyReport,
    *,
    checkpoints: Sequence[StoredCheckpointLike] | None = None,
) -> VerifyReport:
    """Each stored checkpoint (or each of ``checkpoints``: those a session's verification used) is
    signed by a key allowed at its size (only matters after a rotation)."""
    if not report.ok or not history.rotations:
        return report
    from truss.ledger.witnessed import check_checkpoint_signers

    held = store.checkpoints() if checkpoints is None else checkpoints
    notes = [(cp.note.encode("utf-8"), f"the stored checkpoint of size {cp.size}") for cp in held]
    finding = check_checkpoint_signers(notes, history.checkpoint_keys, store.origin)
    return report if finding is None else failed_report(report, *finding)


# -- the log checks of a whole-ledger verification ---------------------------------------------


class LogAudit:
    """The Merkle steps of ``truss ledger verify --all`` (docs/ledger-format.md, L1-L5).

    Plug ``check`` into ``verification.verify_ledger(..., extra=[audit.check])`` (its V12) and call
    ``finish`` after the stream. It rebuilds the tree from the entries' own bytes, so nothing
    the store says about the tree is taken on trust:

    L1 every entry is the next leaf: its index is the count of entries before it, and with
       ``node`` the stored leaf hash at that index equals the hash of its bytes (``leaf_mismatch``);
    L2 at each stored checkpoint's size, the rebuilt root equals that checkpoint's root
       (``checkpoint_root_mismatch``), so all checkpoints are prefixes of one tree: mutually
       consistent by construction;
    L3 each stored checkpoint's note is signed by a trusted key for this origin and says the
       size and root its row says (``bad_stored_checkpoint`` or the note's own reason);
    L4 no checkpoint is larger than the log (``log_shrank``);
    L5 the rebuilt root equals the store's tree root, computed both from its nodes and from its
       stored frontier (``tree_mismatch``).

    L1 also compares every interior node an entry completes with the node the store holds
    (``node_mismatch``): later checkpoints, inclusion and consistency proofs are built from them.
    """

    def __init__(
        self,
        checkpoints: Sequence[StoredCheckpointLike],
        trusted: TrustedKeys,
        origin: str,
        *,
        node: Callable[[int, int], bytes] | None = None,
    ) -> None:
        self.frontier = Frontier()
        self._node = node
        self._roots: dict[int, bytes] = {}
        self._problem: tuple[str, str] | None = None
        self.checked = 0
        for cp in checkpoints:
            try:
                opened = open_checkpoint(cp.note.encode("utf-8"), list(trusted), origin=origin)  # L3
            except (VerificationError, InputError) as exc:
                reason = str(exc.fields.get("reason") or exc.kind)
                self._problem = self._problem or (reason, f"stored checkpoint of size {cp.size}: {exc.message}")
                continue
            if (opened.size, opened.root) != (cp.size, cp.root):
                self._problem = self._problem or (
                    "bad_stored_checkpoint",
                    f"the stored checkpoint of size {cp.size} does not match its signed note",
                )
            self._roots[opened.size] = opened.root
        self._check_root()

    def _check_root(self) -> tuple[str, str] | None:
        expected = self._roots.get(self.frontier.size)
        if expected is not None:
            self.checked += 1
            if self.frontier.root() != expected:  # L2
                return (
                    "checkpoint_root_mismatch",
                    f"the first {self.frontier.size} entries do not hash to the root of the checkpoint of that size",
                )
        return None

    def check(self, item: StoredEntry) -> tuple[str, str] | None:
        """The V12 hook: L1 and L2 for one entry, in log order."""
        index = item.index
        if index != self.frontier.size:
            return "leaf_mismatch", f"log index {index} arrives where leaf {self.frontier.size} belongs"
        leaf = leaf_hash(item.raw)
        completed = self.frontier.append(leaf)
        if self._node is not None:
            for level, at, digest in completed:
                try:
                    stored = self._node(level, at)
                except StoreError:
                    stored = None
                if stored == digest:
                    continue
                if level == 0:  # L1
                    return "leaf_mismatch", f"the stored Merkle leaf {index} is not the hash of the entry at that index"
                # L1: every interior node the log completes is the hash of its two children as rebuilt.
                return (
                    "node_mismatch",
                    f"the stored Merkle node ({level}, {at}) is not the hash of the entries below it",
                )
        return self._check_root()

    def finish(self, tree_size: int, tree_root: bytes) -> tuple[str, str] | None:
        """L3-L5 once every entry went through ``check``; ``None`` when the log checks out."""
        if self._problem is not None:
            return self._problem
        beyond = [size for size in self._roots if size > self.frontier.size]
        if beyond:  # L4
            return "log_shrank", f"a checkpoint of size {max(beyond)} was signed, the log holds {self.frontier.size}"
        if self.frontier.size != tree_size or self.frontier.root() != tree_root:  # L5
            return "tree_mismatch", "the stored Merkle tree does not match the entries"
        return None


class SessionInLog:
    """The Merkle step of ``truss ledger verify SESSION`` (L6), a V12 hook.

    Each entry of the session must be the leaf at its index: proven by an inclusion proof (from
    the stored nodes) against the latest stored checkpoint whose signed note verifies under the
    trusted keys, or, for entries appended after that checkpoint, equal to the stored leaf
    (``not_in_log``). Without any trusted checkpoint only the stored leaves are compared.

    ``batch=True`` (the verified reader): ``check`` only notes the leaves the checkpoint covers,
    and ``settle`` proves all those noted since the last ``settle`` at once, by recomputing the
    checkpoint's root from them (``merkle.root_with_leaves``: O(log n) stored nodes per batch of
    adjacent entries instead of per entry). A batch that does not prove is proven entry by entry,
    so the finding names the first entry that is not in the log. The caller must not use an
    entry before the ``settle`` after its ``check`` returned ``None``. Either way, the nodes one
    proof (or one batch) needs are read in one lookup: the store's queries per entry do not grow
    with the log. One entry's proof is folded as its nodes arrive (``merkle.LeafProver`` over
    ``node_hashes``, the store's ``LedgerStore.node_hashes``; when none is given, ``nodes`` in order),
    and stops at the path of the entry proven before it, so that ``verify SESSION`` reads about two
    nodes an entry and holds one path (``log2(n) + 1`` hashes), however long the log.
    """

    def __init__(
        self,
        checkpoints: Sequence[StoredCheckpointLike],
        trusted: TrustedKeys,
        origin: str,
        nodes: GetNodes,
        *,
        batch: bool = False,
        node_hashes: NodeHashes | None = None,
    ) -> None:
        self._batch = batch
        self._hashes = node_hashes if node_hashes is not None else in_order(nodes)
        self._pending: dict[int, tuple[bytes, Any]] = {}  # log index -> (leaf hash, seq), not yet proven
        self.failed: tuple[Any, int] | None = None  # (seq, log index) of the entry ``settle`` found
        self._nodes = nodes
        self.checkpoint: Checkpoint | None = None
        self._prover: LeafProver | None = None  # built on the first entry the checkpoint covers
        for cp in sorted(checkpoints, key=lambda c: c.size, reverse=True):
            try:
                self.checkpoint = open_checkpoint(cp.note.encode("utf-8"), list(trusted), origin=origin)
                break
            except (VerificationError, InputError):
                continue  # an unusable checkpoint proves nothing; LogAudit (--all) names it
        self.proven = 0

    def settle(self) -> tuple[str, str] | None:
        """Prove the leaves ``check`` noted since the last call (``batch=True``); ``None`` when they all are."""
        pending, self._pending = self._pending, {}
        cp = self.checkpoint
        if not pending or cp is None:
            return None
        try:
            node = fetched(self._nodes, leaves_nodes(pending, cp.size))
            if root_with_leaves({index: leaf for index, (leaf, _) in pending.items()}, cp.size, node) == cp.root:
                self.proven += len(pending)
                return None
        except TrussError:
            pass  # a stored node is missing: the entry it cannot prove is named below
        for index in sorted(pending):  # the first entry that does not prove is the finding
            leaf, seq = pending[index]
            try:
                proven = verify_inclusion(leaf, index, cp.size, self._inclusion_proof(index, cp.size), cp.root)
            except TrussError as exc:
                self.failed = (seq, index)
                return "not_in_log", f"entry {seq}: the Merkle tree cannot prove it ({exc.message})"
            if not proven:
                self.failed = (seq, index)
                return "not_in_log", f"entry {seq}: it is not the leaf at log index {index}"
        return "not_in_log", f"the entries from log index {min(pending)}: the stored Merkle nodes disagree about them"

    def check(self, item: StoredEntry) -> tuple[str, str] | None:
        leaf = leaf_hash(item.raw)
        index = item.index
        try:
            cp = self.checkpoint
            if self._batch and cp is not None and 0 <= index < cp.size:
                self._pending[index] = (leaf, item.seq)
                return None
            if cp is not None and index < cp.size:
                # Each entry is proven on its own, its nodes folded as the store streams them; the fold
                # stops at the first subtree the session's earlier proofs authenticated (LeafProver).
                prover = self._prover
                if prover is None:
                    prover = self._prover = LeafProver(cp.size, cp.root)
                if prover.prove(leaf, index, self._hashes):
                    self.proven += 1
                    return None
            elif self._nodes([(0, index)])[(0, index)] == leaf:
                return None
        except TrussError as exc:
            return "not_in_log", f"entry {item.seq}: the Merkle tree cannot prove it ({exc.message})"
        return "not_in_log", f"entry {item.seq}: it is not the leaf at log index {index}"

    def _inclusion_proof(self, index: int, size: int) -> list[bytes]:
        return inclusion_proof(index, size, fetched(self._nodes, inclusion_nodes(index, size)))


def session_in_log(
    store: AuditSource, trusted: TrustedKeys, *, batch: bool = False
) -> tuple[SessionInLog, list[StoredCheckpointLike]]:
    """L6 for one session, and the stored checkpoints it read: one session needs one checkpoint,
    the latest (an index lookup). Only when that one does not open under ``trusted`` are the
    earlier ones read, latest first, so a session read costs the same at 20,000 checkpoints as at 20."""
    latest = store.latest_checkpoint()
    used: list[StoredCheckpointLike] = [latest] if latest is not None else []
    in_log = SessionInLog(used, trusted, store.origin, store.nodes, batch=batch, node_hashes=store.node_hashes)
    if in_log.checkpoint is None and latest is not None:
        used = list(store.checkpoints())
        in_log = SessionInLog(used, trusted, store.origin, store.nodes, batch=batch, node_hashes=store.node_hashes)
    return in_log, used


# -- --since ------------------------------------------------------------------------------------


class SinceSource(Protocol):
    origin: str

    def tree_head(self) -> tuple[int, bytes]: ...

    def nodes(self, keys: Sequence[tuple[int, int]]) -> Mapping[tuple[int, int], bytes]: ...

    def read_range(self, start: int, stop: int) -> Iterator[StoredEntry]: ...

    def checkpoints(self) -> Sequence[StoredCheckpointLike]: ...

    def latest_checkpoint(self) -> StoredCheckpointLike | None: ...

    def checkpoint_covering(self, size: int) -> StoredCheckpointLike | None: ...


@dataclass(frozen=True)
class SinceReport:
    """Does the current log extend the old checkpoint? ``old_*`` and ``size``/``root`` say which."""

    ok: bool
    old_size: int | None = None
    old_root: str | None = None
    size: int | None = None
    root: str | None = None
    latest_checkpoint: str | None = None
    reason: str | None = None
    message: str | None = None
    exit_code: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ok": self.ok,
            "old": {"size": self.old_size, "root": self.old_root},
            "current": {"size": self.size, "root": self.root},
            "latest_checkpoint": self.latest_checkpoint,
        }
        if not self.ok:
            out.update(reason=self.reason, message=self.message)
        return out

    def raise_for_failure(self) -> SinceReport:
        """This report when the log extends the checkpoint; else raise what it found.

        ``VerificationError`` (the log was rewritten, truncated or forked), or the ``InputError``
        of a checkpoint that cannot be used (unparseable, another log's, untrusted signer).
        """
        if self.ok:
            return self
        error = InputError if self.exit_code == 2 else VerificationError
        raise error(
            self.message or "the log does not extend the checkpoint",
            remedy="do not trust this log beyond the checkpoint you hold",
            reason=self.reason,
            size=self.size,
            old_size=self.old_size,
        )


def verify_since(
    store: SinceSource, old_checkpoint: bytes, trusted: TrustedKeys | KeyHistory, *, recompute: bool = True
) -> SinceReport:
    """Prove that ``store``'s log is an append-only extension of ``old_checkpoint``.

    S1 open the old checkpoint with ``trusted`` (origin = the store's log); given the log's key
    history, only with the keys allowed to sign at its size (``retired_key`` for a key rotated away
    before it: such a note is not the log's, and is no evidence of a fork); S2 with
    ``recompute``, rebuild the root from the stored entries' bytes and compare it with the
    stored tree (a rewritten entry under untouched nodes is caught here); S3 a larger old size
    than the log is a truncation; S4 the RFC 9162 consistency proof from the old size to the
    current one must verify (a same-size checkpoint with another root is a fork).
    """
    facts: dict[str, Any] = {}
    try:
        old = _open_old(old_checkpoint, trusted, store.origin)  # S1
    except (VerificationError, InputError) as exc:
        return SinceReport(
            ok=False, reason=str(exc.fields.get("reason") or exc.kind), message=exc.message, exit_code=exc.exit_code
        )
    size, root = store.tree_head()
    facts.update(old_size=old.size, old_root=old.root.hex(), size=size, root=root.hex())
    latest = store.latest_checkpoint()
    if latest is not None:
        facts["latest_checkpoint"] = latest.note
    if recompute:  # S2
        frontier = Frontier()
        for item in store.read_range(0, size):
            if item.index != frontier.size:
                return _since_fail(facts, "index_gap", f"the log's entry {frontier.size} is missing")
            frontier.append(leaf_hash(item.raw))
        if frontier.size != size or frontier.root() != root:
            return _since_fail(facts, "tree_mismatch", "the stored entries do not hash to the stored Merkle tree")
    if old.size > size:  # S3
        return _since_fail(
            facts, "log_shrank", f"the log holds {size} entries, fewer than the {old.size} of the old checkpoint"
        )
    proof = consistency_proof(old.size, size, fetched(store.nodes, consistency_nodes(old.size, size)))  # S4
    if not verify_consistency(old.size, size, old.root, root, proof):
        same = store.checkpoint_covering(old.size)
        if old.size == size or (same is not None and same.size == old.size and same.root != old.root):
            return _since_fail(
                facts, "fork", f"the log at size {old.size} has another root than the old checkpoint: a fork"
            )
        return _since_fail(
            facts, "inconsistent", f"the log was rewritten: it does not extend the checkpoint of size {old.size}"
        )
    return SinceReport(ok=True, **facts)


def _open_old(note: bytes, trusted: TrustedKeys | KeyHistory, origin: str) -> Checkpoint:
    if not isinstance(trusted, KeyHistory):
        return open_checkpoint(note, list(trusted), origin=origin)
    if not trusted.rotations:
        return open_checkpoint(note, list(trusted.trusted), origin=origin)
    size = parse_checkpoint(parse_note(note).text).size  # form only: which keys may have signed it depends on its size
    try:
        return open_checkpoint(note, trusted.checkpoint_keys(size), origin=origin)
    except VerificationError as exc:
        if exc.fields.get("reason") != "no_trusted_signature":
            raise
        open_checkpoint(note, list(trusted.trusted), origin=origin)  # a key of the log at all?
        raise VerificationError(
            f"the checkpoint of size {size} is signed by a key of the log that does not sign at that size "
            "(it was rotated away before)",
            remedy="compare with a checkpoint the log signed with the key it held then",
            reason="retired_key",
            size=size,
        ) from None


def _since_fail(facts: dict[str, Any], reason: str, message: str) -> SinceReport:
    return SinceReport(ok=False, reason=reason, message=message, exit_code=1, **facts)
