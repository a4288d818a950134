"""The log's own record, and the key history a verifier follows from a trusted starting key.

Some signed entries belong to the log rather than to a run: key rotations (``key_rotated``) and
witness outcomes (``checkpoint_witnessed``). They go in one log-level session with the reserved
id ``@log`` (``LOG_SESSION``; ``@`` is never in a run's session id, so no caller can name it),
which starts with a ``session_started`` body ``{"scope": "log"}`` and never ends. It is chained,
signed, indexed and proven like any session; listings of runs leave it out
(``is_log_session``).

A **rotation statement** is a ``key_rotated`` entry, signed (as every entry) by the key it
retires. Its body::

    {"key": <new verifier key>, "replaces": <old verifier key>, "from_index": <its own index + 1>,
     "proof": <base64 Ed25519 signature by the new key over PAE(ROTATION_PAYLOAD_TYPE,
               canonical({"log", "key", "replaces", "from_index"}))>}

so the old key signs the new verifier key and the log index from which the new key signs, and the
new key shows it consents (a statement cannot hand the log to a key nobody holds). The log's
origin, the name of every key, stays the same.

``follow_rotations`` walks the ``@log`` entries from the keys a verifier trusts: a statement
counts only when it is signed by a key valid at its index (otherwise it is forged:
``forged_rotation``) and is well formed (``bad_rotation``). The result, a ``KeyHistory``, is the
list of periods (key, from index, until index); ``check`` is a V12 hook refusing an entry signed
by a key outside its period (``retired_key``), and ``checkpoint_keys(size)`` the keys that may
sign a checkpoint of that size (valid at ``size - 1`` or from ``size``). A history is a list of
signed statements a verifier follows, so more signers per log (one key per worker) extend it:

An **admission statement** is a ``key_admitted`` entry, signed by a *log* key (one the verifier
trusts from the start, or a key rotated from one) valid at its index. Its body::

    {"key": <the worker's verifier key>,
     "proof": <base64 Ed25519 signature by the worker's key over PAE(ADMISSION_PAYLOAD_TYPE,
               canonical({"log", "key"}))>}

admits a *worker* key: from its own index + 1 on, entries signed by that key verify. The proof is
the worker's join request (``join_request``): a log key cannot admit a key nobody consented to.
A **removal statement** (``key_removed``, body ``{"key": <verifier key>}``, signed by a log key)
ends a worker key's period at its own index + 1. A worker key signs entries (and may rotate itself
with a ``key_rotated`` statement; its successor is a worker key too) but never admits or removes
keys and never signs checkpoints: ``checkpoint_keys`` holds log keys only.

Sans-IO. What it does not do: read the store (callers pass the ``@log`` entries) or write keys.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from truss._errors import BundleFormatError, InputError, StoreConflictError, VerificationError
from truss.ledger.canonical import CanonicalError, canonical
from truss.ledger.entry import Record, StoredEntry, entry_bytes, entry_signing_payload, pae
from truss.ledger.envelope import VerdictStatement, open_verdict
from truss.ledger.keys import IdentityKey, TrustedKeys, VerifierKey
from truss.ledger.merkle import fetched, inclusion_nodes, inclusion_proof

__all__ = [
    "ADMISSION_PAYLOAD_TYPE",
    "LOG_SESSION",
    "ROTATION_PAYLOAD_TYPE",
    "STATEMENT_KINDS",
    "KeyHistory",
    "KeyPeriod",
    "LogAppender",
    "admission_record",
    "admission_statement",
    "append_to_log",
    "bundle_key_history",
    "ensure_log_session",
    "follow_rotations",
    "is_log_session",
    "join_request",
    "log_entries",
    "log_session_start",
    "removal_record",
    "rotation_proofs",
    "rotation_record",
    "rotation_statement",
]

LOG_SESSION = "@log"
ROTATION_PAYLOAD_TYPE = "application/vnd.truss.key-rotation.v1+json"
ADMISSION_PAYLOAD_TYPE = "application/vnd.truss.key-admission.v1+json"
STATEMENT_KINDS = frozenset({"key_rotated", "key_admitted", "key_removed"})
_ROTATION_FIELDS = frozenset({"key", "replaces", "from_index", "proof"})
_ADMISSION_FIELDS = frozenset({"key", "proof"})
_REMOVAL_FIELDS = frozenset({"key"})
_MAX_STATEMENTS = 1000


def is_log_session(session: str) -> bool:
    """True for the reserved log-level session(s): ids starting with ``@`` are never a run's."""
    return session.startswith("@")


def log_session_start() -> Record:
    return Record("session_started", {"scope": "log"})


class LogAppender(Protocol):
    """What ``append_to_log`` needs from a store."""

    def session(self, session: str) -> Any: ...

    def append(
        self,
        session: str,
        records: Sequence[Record],
        *,
        durable: bool = True,
        expect_seq: int | None = None,
        expect_index: int | None = None,
    ) -> list[StoredEntry]: ...


def ensure_log_session(store: LogAppender) -> None:
    """Start the ``@log`` session if the log has none yet (two writers racing both succeed)."""
    if store.session(LOG_SESSION) is not None:
        return
    try:
        store.append(LOG_SESSION, [log_session_start()], durable=True, expect_seq=0)
    except StoreConflictError:
        return  # another writer started it first


def append_to_log(
    store: LogAppender, records: Sequence[Record], *, expect_index: int | None = None
) -> list[StoredEntry]:
    """Append the log's own ``records`` to ``@log`` (durably), starting that session if needed."""
    ensure_log_session(store)
    return store.append(LOG_SESSION, list(records), durable=True, expect_index=expect_index)


def rotation_statement(log: str, key: str, replaces: str, from_index: int) -> bytes:
    """The bytes the new key signs in a rotation: its PAE over the canonical statement."""
    statement = {"log": log, "key": key, "replaces": replaces, "from_index": from_index}
    return pae(ROTATION_PAYLOAD_TYPE, canonical(statement))


def rotation_record(old: IdentityKey, new: IdentityKey, from_index: int) -> Record:
    """The ``key_rotated`` record retiring ``old`` for ``new`` from ``from_index`` (its index + 1).

    The store signs the entry with ``old`` (the key it was opened with); ``new`` signs the proof.
    """
    if old.name != new.name:
        raise ValueError("a rotated key keeps the log's name (the origin)")
    proof = new.sign(rotation_statement(old.name, new.verifier.vkey, old.verifier.vkey, from_index))
    return Record(
        "key_rotated",
        {
            "key": new.verifier.vkey,
            "replaces": old.verifier.vkey,
            "from_index": from_index,
            "proof": base64.b64encode(proof).decode("ascii"),
        },
    )


def admission_statement(log: str, key: str) -> bytes:
    """The bytes a worker key signs to consent to joining ``log``: its PAE over the canonical statement."""
    return pae(ADMISSION_PAYLOAD_TYPE, canonical({"log": log, "key": key}))


def join_request(worker: IdentityKey) -> str:
    """The worker's consent to be admitted to the log named after its key: base64 of its signature."""
    proof = worker.sign(admission_statement(worker.name, worker.verifier.vkey))
    return base64.b64encode(proof).decode("ascii")


def admission_record(worker: VerifierKey, proof: str) -> Record:
    """The ``key_admitted`` record admitting ``worker`` (the store signs it with the log key it holds).

    Raises ``InputError`` when ``proof`` is not the worker key's signature of its admission statement.
    """
    try:
        raw = base64.b64decode(proof, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if not worker.verify(admission_statement(worker.name, worker.vkey), raw):
        raise InputError(
            f"the join proof does not verify under the worker key {worker.key_id}",
            remedy="copy the key and the proof `truss init --join` printed on the worker, both whole",
        )
    return Record("key_admitted", {"key": worker.vkey, "proof": proof})


def removal_record(worker: VerifierKey) -> Record:
    """The ``key_removed`` record ending the period of the worker key ``worker``."""
    return Record("key_removed", {"key": worker.vkey})


@dataclass(frozen=True)
class KeyPeriod:
    """A key and the log indexes it signs: ``from_index`` <= index < ``until_index`` (None: open).

    ``statement`` is the rotation or admission entry that introduced it (None for a key trusted from
    the start). ``role``: ``"log"`` (a trusted key or one rotated from it: signs entries and
    checkpoints, admits and removes workers) or ``"worker"`` (an admitted key: signs entries only).
    """

    key: VerifierKey
    from_index: int
    until_index: int | None
    statement: StoredEntry | None = None
    role: str = "log"

    def covers(self, index: int) -> bool:
        return self.from_index <= index and (self.until_index is None or index < self.until_index)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "vkey": self.key.vkey,
            "key_id": self.key.key_id,
            "from_index": self.from_index,
            "until_index": self.until_index,
            "role": self.role,
        }
        if self.statement is not None:
            out["statement"] = self.statement.to_json()
        return out


class KeyHistory:
    """The periods of every key a verifier accepts, in the order they were introduced."""

    def __init__(self, periods: Sequence[KeyPeriod]) -> None:
        self.periods = list(periods)
        self.trusted = TrustedKeys(p.key for p in self.periods)
        ids = [p.key.key_id for p in self.periods]
        self._shared_ids = {i for i in ids if ids.count(i) > 1}

    @property
    def rotations(self) -> list[KeyPeriod]:
        return [p for p in self.periods if p.statement is not None]

    def valid_at(self, index: int) -> list[VerifierKey]:
        return [p.key for p in self.periods if p.covers(index)]

    def check(self, item: StoredEntry) -> tuple[str, str] | None:
        """V12: the entry's signature is by a key whose period covers its index."""
        index = item.index
        valid = [p for p in self.periods if p.key.key_id == item.keyid and p.covers(index)]
        if valid and item.keyid not in self._shared_ids:
            return None
        if valid and any(p.key.verify(entry_signing_payload(item.raw), item.sig) for p in valid):
            return None
        periods = [p for p in self.periods if p.key.key_id == item.keyid]
        spans = ", ".join(f"[{p.from_index}, {'...' if p.until_index is None else p.until_index})" for p in periods)
        return (
            "retired_key",
            f"entry {item.seq} of session {item.session!r} (log index {index}) is signed by key {item.keyid}, "
            f"which signs only log indexes {spans or 'none'}",
        )

    def checkpoint_keys(self, size: int) -> list[VerifierKey]:
        """Keys that may sign a checkpoint of ``size``: valid for its last entry, or from ``size`` on."""
        keys: list[VerifierKey] = []
        for p in self.periods:
            if p.role != "log":
                continue  # a worker key signs entries, never a checkpoint
            if p.from_index <= size and (p.until_index is None or size <= p.until_index):
                keys.append(p.key)
        return keys

    def open_verdict(
        self, envelope: Any, *, session: str, head: str, head_index: int | Callable[[], int]
    ) -> VerdictStatement:
        """The verdict envelope of ``session`` (whose last entry is ``head``, at ``head_index``) opened
        under the keys that sign at that entry: the key that signed it signed the verdict right
        after, so a key rotated away before is ``retired_key`` whatever its envelope says (B7, L7,
        R4). ``head_index`` may be a callable, asked only after a rotation (it may cost a read)."""
        if not self.rotations:
            return open_verdict(envelope, self.trusted, session=session, head=head)
        index = head_index if isinstance(head_index, int) else head_index()
        try:
            return open_verdict(envelope, TrustedKeys(self.valid_at(index)), session=session, head=head)
        except VerificationError:
            open_verdict(envelope, self.trusted, session=session, head=head)  # a key of the log at all?
            raise VerificationError(
                f"the verdict envelope of session {session!r} is signed by a key of the log that no longer "
                f"signed at log index {index} (the session's last entry): it was rotated away before",
                remedy="do not trust this verdict; the holder of a retired key may have signed it",
                reason="retired_key",
            ) from None

    def to_json(self) -> list[dict[str, Any]]:
        return [p.to_json() for p in self.periods]


def _statement_error(item: StoredEntry, what: str, message: str, remedy: str, reason: str) -> VerificationError:
    """The refusal of the ``what`` statement ``item`` (a rotation, or an admission or removal)."""
    return VerificationError(
        f"{what} statement at log index {item.entry.get('index')}: {message}",
        remedy=remedy,
        reason=reason,
        session=LOG_SESSION,
        seq=item.entry.get("seq"),
        index=item.entry.get("index"),
    )


def _forged(item: StoredEntry, message: str) -> VerificationError:
    remedy = "do not trust entries signed by the key it introduces; the log's key history was forged"
    return _statement_error(item, "rotation", message, remedy, "forged_rotation")


def _bad(item: StoredEntry, message: str) -> VerificationError:
    remedy = "the key history is malformed; do not trust entries signed after it"
    return _statement_error(item, "rotation", message, remedy, "bad_rotation")


def _forged_admission(item: StoredEntry, message: str) -> VerificationError:
    remedy = "do not trust entries signed by the key it names; the log's key set was forged"
    return _statement_error(item, item.kind, message, remedy, "forged_admission")


def _bad_admission(item: StoredEntry, message: str) -> VerificationError:
    remedy = "the log's key set is malformed; do not trust entries signed after it"
    return _statement_error(item, item.kind, message, remedy, "bad_admission")


def _admit_or_remove(item: StoredEntry, periods: list[KeyPeriod], origin: str, index: int) -> None:
    """Apply a ``key_admitted`` or ``key_removed`` statement (already checked to be of this log) to ``periods``."""
    raw_body: Any = item.entry.get("body")
    body: dict[str, Any] = cast(dict[str, Any], raw_body) if isinstance(raw_body, dict) else {}
    payload = entry_signing_payload(item.raw)
    signer = next((p for p in periods if p.key.key_id == item.keyid and p.key.verify(payload, item.sig)), None)
    if signer is None:
        return  # signed by a key the verifier does not start from: the key it names stays unknown
    if signer.role != "log":
        raise _forged_admission(
            item, f"it is signed by the worker key {signer.key.key_id}; only a log key changes the key set"
        )
    if not signer.covers(index):
        raise _forged_admission(
            item, f"it is signed by key {signer.key.key_id}, which was retired before index {index}"
        )
    fields = _ADMISSION_FIELDS if item.kind == "key_admitted" else _REMOVAL_FIELDS
    if frozenset(body) != fields:
        raise _bad_admission(item, f"its body has the fields {sorted(fields)}")
    try:
        named = VerifierKey.parse(str(body.get("key")))
    except InputError:
        raise _bad_admission(item, "its key cannot be parsed") from None
    if named.name != origin:
        raise _bad_admission(item, f"the key is named {named.name!r}; every key of the log is named {origin!r}")
    known = [i for i, p in enumerate(periods) if p.key == named]
    if item.kind == "key_removed":
        open_worker = next((i for i in known if periods[i].role == "worker" and periods[i].until_index is None), None)
        if open_worker is None:
            raise _bad_admission(item, f"it removes key {named.key_id}, which is not an admitted worker key")
        p = periods[open_worker]
        periods[open_worker] = KeyPeriod(p.key, p.from_index, index + 1, p.statement, p.role)
        return
    try:
        proof = base64.b64decode(str(body.get("proof")), validate=True)
    except (binascii.Error, ValueError):
        raise _bad_admission(item, "its proof is not base64") from None
    if not named.verify(admission_statement(origin, named.vkey), proof):
        raise _bad_admission(item, "the worker key's proof does not verify (its holder did not ask to join)")
    if any(periods[i].statement is not None for i in known):
        raise _bad_admission(item, f"key {named.key_id} was already admitted to, rotated in or removed from the log")
    if not known:  # a key the verifier already trusts from the start keeps that trust
        periods.append(KeyPeriod(named, index + 1, None, item, "worker"))


def follow_rotations(entries: Iterable[StoredEntry], trusted: TrustedKeys, *, origin: str) -> KeyHistory:
    """Follow the key statements among ``entries`` (the ``@log`` session, in order: rotations,
    admissions and removals of worker keys) from the ``trusted`` keys, each a log key valid from
    index 0. Raises ``VerificationError`` (``forged_rotation``, ``bad_rotation``,
    ``forged_admission``, ``bad_admission``) for the first statement that does not hold."""
    periods = [KeyPeriod(key, 0, None) for key in trusted]
    for item in _rotations(entries):
        index = item.entry.get("index")
        if not isinstance(index, int) or item.entry.get("log") != origin:
            raise _bad(item, "it is not an entry of this log")
        try:
            well_formed = entry_bytes(item.entry) == item.raw and hashlib.sha256(item.raw).hexdigest() == item.hash
        except CanonicalError:
            well_formed = False
        if not well_formed:
            raise _bad(item, "its bytes or hash do not match the entry")
        if item.kind != "key_rotated":
            _admit_or_remove(item, periods, origin, index)
            continue
        payload = entry_signing_payload(item.raw)
        raw_body: Any = item.entry.get("body")
        body: dict[str, Any] = cast(dict[str, Any], raw_body) if isinstance(raw_body, dict) else {}
        signer = next(
            (i for i, p in enumerate(periods) if p.key.key_id == item.keyid and p.key.verify(payload, item.sig)), None
        )
        if signer is None:
            claimed = body.get("replaces")
            if any(p.key.vkey == claimed for p in periods):
                raise _forged(item, f"it rotates a trusted key but is signed by another one (key id {item.keyid})")
            continue  # a statement about keys before the ones trusted: the verifier starts after it
        old = periods[signer]
        if not old.covers(index):
            raise _forged(item, f"it is signed by key {old.key.key_id}, which was retired before index {index}")
        if frozenset(body) != _ROTATION_FIELDS:
            raise _bad(item, f"its body has the fields {sorted(_ROTATION_FIELDS)}")
        if body.get("replaces") != old.key.vkey:
            raise _forged(item, "the key it says it replaces is not the key that signed it")
        if body.get("from_index") != index + 1:
            raise _bad(item, f"from_index is {body.get('from_index')!r}, not its own index + 1 ({index + 1})")
        try:
            new = VerifierKey.parse(str(body.get("key")))
            proof = base64.b64decode(str(body.get("proof")), validate=True)
        except (InputError, binascii.Error, ValueError):
            raise _bad(item, "its new key or proof cannot be parsed") from None
        if new.name != origin:
            raise _bad(item, f"the new key is named {new.name!r}; a rotated key keeps the origin {origin!r}")
        if not new.verify(rotation_statement(origin, new.vkey, old.key.vkey, index + 1), proof):
            raise _bad(item, "the new key's proof does not verify (it names a key whose holder did not accept it)")
        known = [p for p in periods if p.key == new]
        if new == old.key or any(p.statement is not None for p in known):
            raise _bad(item, "the new key is a key the log already rotated to or from")
        periods[signer] = KeyPeriod(old.key, old.from_index, index + 1, old.statement, old.role)
        if not known:  # a key the verifier already trusts from the start keeps that trust
            periods.append(KeyPeriod(new, index + 1, None, item, old.role))  # a worker's successor is a worker
    return KeyHistory(periods)


def _rotations(entries: Iterable[StoredEntry]) -> Iterator[StoredEntry]:
    """The key statements (rotations, admissions, removals) among ``entries``."""
    for item in entries:
        if item.entry.get("kind") in STATEMENT_KINDS:
            yield item


class _HistorySource(Protocol):
    def session(self, session: str) -> Any: ...

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterator[StoredEntry]: ...

    def nodes(self, keys: Sequence[tuple[int, int]]) -> Mapping[tuple[int, int], bytes]: ...


class _LogReader(Protocol):
    def session(self, session: str) -> Any: ...

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterable[StoredEntry]: ...


def log_entries(store: _LogReader) -> list[StoredEntry]:
    """The ``@log`` session's entries in order (none when the log has no such session yet)."""
    return list(store.read_session(LOG_SESSION)) if store.session(LOG_SESSION) is not None else []


def rotation_proofs(store: _HistorySource, size: int) -> list[dict[str, Any]]:
    """The log's key statements before ``size``, each with its inclusion proof in the tree of
    that size: what a bundle carries so a verifier can follow the key history offline."""
    if store.session(LOG_SESSION) is None:
        return []
    statements = [item for item in _rotations(store.read_session(LOG_SESSION)) if item.index < size]
    node = fetched(store.nodes, *(inclusion_nodes(item.index, size) for item in statements))  # one lookup
    out: list[dict[str, Any]] = []
    for item in statements:
        proof = inclusion_proof(item.index, size, node)
        out.append({"entry": item.to_json(), "inclusion": [base64.b64encode(h).decode("ascii") for h in proof]})
    return out


def bundle_key_history(doc: Mapping[str, Any], origin: str) -> list[tuple[StoredEntry, list[bytes]]]:
    """The ``key_history`` of a parsed bundle: each statement and its inclusion proof.

    Raises ``BundleFormatError`` (``bad_fields``) for a field that is not a list of
    ``{"entry", "inclusion"}`` objects; the statements are checked by ``follow_rotations``.
    """
    raw: Any = doc.get("key_history", [])
    if not isinstance(raw, list) or len(cast(list[Any], raw)) > _MAX_STATEMENTS:
        raise _format(f"a bundle's key_history is a list of at most {_MAX_STATEMENTS} statements")
    out: list[tuple[StoredEntry, list[bytes]]] = []
    for item in cast(list[Any], raw):
        if not isinstance(item, dict):
            raise _format("a key_history item is an object with entry and inclusion")
        fields = cast(dict[str, Any], item)
        if set(fields) != {"entry", "inclusion"}:
            raise _format("a key_history item is an object with entry and inclusion")
        entry = StoredEntry.from_json(fields["entry"])
        if entry.entry.get("kind") not in STATEMENT_KINDS or entry.entry.get("log") != origin:
            raise _format(
                "a key_history item is a key statement (key_rotated, key_admitted, key_removed) of the bundle's log"
            )
        hashes: Any = fields["inclusion"]
        if not isinstance(hashes, list) or len(cast(list[Any], hashes)) > 64:
            raise _format("a key_history inclusion proof is a list of at most 64 hashes")
        proof: list[bytes] = []
        for h in cast(list[Any], hashes):
            try:
                value = base64.b64decode(str(h), validate=True)
            except (binascii.Error, ValueError):
                raise _format("a key_history inclusion proof holds base64 hashes") from None
            if len(value) != 32:
                raise _format("a key_history inclusion proof holds 32-byte hashes")
            proof.append(value)
        out.append((entry, proof))
    return out


def _format(message: str) -> BundleFormatError:
    return BundleFormatError(message, remedy="obtain the bundle again from its source", reason="bad_fields")
