"""Offline bundles: one session's evidence in one file, and the checks an auditor runs on it.

A bundle (``export_bundle``) is one canonical JSON object (docs/ledger-format.md, "Bundles"):

    {"format": "truss-bundle", "version": 1, "origin", "session", "vkey", "payloads",
     "entries": [{"entry", "hash", "sig", "keyid"}, ...],      # the whole session, seq order
     "blobs": {"sha256:<hex>": "<base64>"},                    # {} with --no-payloads
     "envelope": {DSSE envelope of the verdict} | null,
     "checkpoint": "<signed checkpoint note>",
     "proof": "<c2sp.org/tlog-proof@v1 text: the head's inclusion in that checkpoint>",
     "inclusion": [[<base64 hash>, ...], ...],                 # one proof per entry, same checkpoint
     "consistency": [<base64 hash>, ...] | null}               # verdict checkpoint -> bundle checkpoint

``verify_bundle(data, trusted)`` follows the numbered steps B1-B8 of that section and returns a
``BundleReport``; ``report.raise_for_failure()`` (and ``check_bundle``) raises over the same
result. Only ``trusted`` decides which keys count: the ``vkey`` a bundle carries is reported, never
trusted. The checks of a store's own log (``LogAudit``, ``verify_since``) are in ``audit``.

Sans-IO: stores are reached through the small protocols below (no sqlite3 here); callers read and
write files. What it does not do: chain rules (``verification``), note and envelope formats (``note``,
``envelope``), or hashing (``merkle``); it composes them.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from truss._errors import BundleFormatError, InputError, NotFoundError, TrussError, VerificationError
from truss._json import as_dict, as_list
from truss.ledger.cosignature import witnessed_checkpoint
from truss.ledger.entry import StoredEntry, entry_bytes, iter_refs
from truss.ledger.envelope import VerdictStatement, parse_envelope
from truss.ledger.keyhistory import KeyHistory, bundle_key_history, follow_rotations, rotation_proofs
from truss.ledger.keys import TrustedKeys, VerifierKey
from truss.ledger.merkle import (
    HASH_SIZE,
    GetNode,
    consistency_nodes,
    consistency_proof,
    fetched,
    inclusion_nodes,
    inclusion_proof,
    leaf_hash,
    root_at,
    root_nodes,
    verify_consistency,
    verify_inclusion,
)
from truss.ledger.note import (
    Checkpoint,
    NoteSigner,
    StoredCheckpointLike,
    open_checkpoint,
    parse_checkpoint,
    parse_note,
    sign_checkpoint,
)
from truss.ledger.verification import verify_entries

__all__ = [
    "BUNDLE_FORMAT",
    "BUNDLE_VERSION",
    "MAX_BUNDLE_BYTES",
    "MAX_BUNDLE_ENTRIES",
    "TLOG_PROOF_HEADER",
    "BundleReport",
    "BundleSource",
    "TlogProof",
    "check_bundle",
    "export_bundle",
    "format_tlog_proof",
    "parse_tlog_proof",
    "verify_bundle",
]

_T = TypeVar("_T")

BUNDLE_FORMAT = "truss-bundle"
BUNDLE_VERSION = 1
TLOG_PROOF_HEADER = "c2sp.org/tlog-proof@v1"
MAX_BUNDLE_BYTES = 256 * 1024 * 1024
MAX_BUNDLE_ENTRIES = 1_000_000
_BUNDLE_KEYS = frozenset(
    {
        "format",
        "version",
        "origin",
        "session",
        "vkey",
        "payloads",
        "entries",
        "blobs",
        "envelope",
        "checkpoint",
        "proof",
        "inclusion",
        "consistency",
    }
)
# Present only when the log rotated its key before the bundle's checkpoint (docs/ledger-format.md 9).
_OPTIONAL_KEYS = frozenset({"key_history"})


# -- the tlog-proof text -----------------------------------------------------------------------


@dataclass(frozen=True)
class TlogProof:
    """A ``c2sp.org/tlog-proof@v1``: leaf ``index``, inclusion ``hashes``, the signed ``checkpoint``."""

    index: int
    hashes: tuple[bytes, ...]
    checkpoint: bytes
    extra: bytes | None = None


def format_tlog_proof(proof: TlogProof) -> str:
    lines = [TLOG_PROOF_HEADER]
    if proof.extra is not None:
        lines.append("extra " + base64.b64encode(proof.extra).decode())
    lines.append(f"index {proof.index}")
    lines.extend(base64.b64encode(h).decode() for h in proof.hashes)
    return "\n".join(lines) + "\n\n" + proof.checkpoint.decode("utf-8")


def parse_tlog_proof(text: str) -> TlogProof:
    """Parse a tlog-proof; raises ``BundleFormatError`` (``reason="bad_proof"``)."""
    head, sep, checkpoint = text.partition("\n\n")
    if not sep:
        raise _format("a tlog-proof has a blank line before its checkpoint", "bad_proof")
    lines = head.split("\n")
    if lines[0] != TLOG_PROOF_HEADER:
        raise _format(f"a tlog-proof starts with the line {TLOG_PROOF_HEADER}", "bad_proof")
    rest = lines[1:]
    extra: bytes | None = None
    if rest and rest[0].startswith("extra "):
        extra = _b64(rest[0][len("extra ") :], "bad_proof")
        rest = rest[1:]
    if not rest or not rest[0].startswith("index "):
        raise _format("a tlog-proof names the leaf index on an 'index N' line", "bad_proof")
    index_text = rest[0][len("index ") :]
    if not index_text.isascii() or not index_text.isdigit() or (index_text != "0" and index_text[0] == "0"):
        raise _format("a tlog-proof's index is a decimal number without leading zeros", "bad_proof")
    hashes = tuple(_b64(line, "bad_proof") for line in rest[1:])
    if len(hashes) > 64 or any(len(h) != HASH_SIZE for h in hashes):
        raise _format("a tlog-proof's hashes are at most 64 base64 SHA-256 hashes", "bad_proof")
    note = _utf8(checkpoint, "a tlog-proof's checkpoint", "bad_proof")
    return TlogProof(index=int(index_text), hashes=hashes, checkpoint=note, extra=extra)


# -- export -----------------------------------------------------------------------------------


class BundleSource(Protocol):
    """What ``export_bundle`` reads from a ledger store (every ``LedgerStore`` is one)."""

    origin: str

    def session(self, session: str) -> Any: ...

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterator[StoredEntry]: ...

    def blob(self, ref: str) -> bytes | None: ...

    def erased_refs(self, session: str) -> set[str]: ...

    def envelope(self, session: str) -> bytes | None: ...

    def tree_head(self) -> tuple[int, bytes]: ...

    def node(self, level: int, index: int) -> bytes: ...

    def nodes(self, keys: Sequence[tuple[int, int]]) -> Mapping[tuple[int, int], bytes]: ...

    def checkpoints(self) -> Sequence[StoredCheckpointLike]: ...

    def latest_checkpoint(self) -> StoredCheckpointLike | None: ...

    def checkpoint_covering(self, size: int) -> StoredCheckpointLike | None: ...

    def add_checkpoint(self, size: int, root: bytes, note: str) -> None: ...


def export_bundle(
    store: BundleSource,
    session: str,
    *,
    vkey: str,
    payloads: bool = True,
    signer: NoteSigner | None = None,
) -> bytes:
    """The bundle of ``session`` as canonical JSON bytes.

    The checkpoint is the one the verdict envelope names when there is one (so the bundle and
    the verdict agree), else the earliest stored checkpoint covering the session's last entry,
    else (with ``signer``) a new one signed now. Payloads the session erased are left out.
    Raises ``NotFoundError`` for an unknown session
    or when no checkpoint covers it and there is no signer, and ``VerificationError`` when the
    chosen checkpoint does not match the stored tree (nothing is written in either case).
    """
    if store.session(session) is None:
        raise NotFoundError(f"no session {session!r} in this ledger", what="session", name=session)
    entries = list(store.read_session(session))
    if not entries:
        raise NotFoundError(f"session {session!r} has no entries", what="session", name=session)
    head = entries[-1]
    envelope_raw = store.envelope(session)
    envelope: dict[str, Any] | None = None
    if envelope_raw is not None:
        envelope = parse_envelope(envelope_raw).to_json()
    note = _choose_checkpoint(store, head.index, envelope_raw, signer)
    named = _predicate_checkpoint(envelope_raw) if envelope_raw is not None else None
    note = witnessed_checkpoint(store.checkpoint_covering, note, head.index)
    checkpoint = parse_checkpoint(parse_note(note).text)
    old = _older_size(named, checkpoint.size)
    # The root's, every entry's proof's and the consistency proof's nodes in one lookup: their
    # number grows with log2 of the log, the store's queries do not.
    node = fetched(
        store.nodes,
        root_nodes(checkpoint.size),
        *(inclusion_nodes(e.index, checkpoint.size) for e in entries),
        consistency_nodes(old, checkpoint.size) if old is not None else (),
    )
    if root_at(checkpoint.size, node) != checkpoint.root:
        raise VerificationError(
            f"the checkpoint of size {checkpoint.size} does not match the stored tree",
            remedy="the ledger was modified after it was checkpointed: run `truss ledger verify --all`",
            reason="checkpoint_root_mismatch",
            size=checkpoint.size,
        )
    proofs = [inclusion_proof(e.index, checkpoint.size, node) for e in entries]
    blobs: dict[str, str] = {}
    if payloads:
        # A payload this session erased stays out, even if another session still holds the bytes.
        erased = store.erased_refs(session)
        for entry in entries:
            for ref in iter_refs(entry.body):
                if ref not in blobs and ref not in erased:
                    data = store.blob(ref)
                    if data is not None:
                        blobs[ref] = base64.b64encode(data).decode("ascii")
    bundle: dict[str, Any] = {
        "format": BUNDLE_FORMAT,
        "version": BUNDLE_VERSION,
        "origin": store.origin,
        "session": session,
        "vkey": vkey,
        "payloads": payloads,
        "entries": [e.to_json() for e in entries],
        "blobs": blobs,
        "envelope": envelope,
        "checkpoint": note.decode("utf-8"),
        "proof": format_tlog_proof(TlogProof(head.index, tuple(proofs[-1]), note)),
        "inclusion": [[base64.b64encode(h).decode("ascii") for h in p] for p in proofs],
        "consistency": _consistency_from(old, checkpoint.size, node),
    }
    history = rotation_proofs(store, checkpoint.size)
    if history:
        bundle["key_history"] = history
    # entry_bytes is canonical() with a fast path for plain JSON; a bundle is mostly entries.
    return entry_bytes(bundle)


def _choose_checkpoint(
    store: BundleSource, head_index: int, envelope: bytes | None, signer: NoteSigner | None
) -> bytes:
    if envelope is not None:
        named = _predicate_checkpoint(envelope)
        if named is not None and parse_checkpoint(parse_note(named).text).size > head_index:
            return named
    covering = store.checkpoint_covering(head_index + 1)
    if covering is not None:
        return covering.note.encode("utf-8")
    if signer is not None:
        signed = sign_checkpoint(store, signer)
        assert signed.note is not None
        return signed.note
    raise NotFoundError(
        f"no checkpoint covers entry {head_index} of the log yet",
        remedy="run `truss ledger checkpoint`, then export again",
        what="checkpoint",
        name=str(head_index),
    )


def _older_size(named: bytes | None, size: int) -> int | None:
    """The size of the verdict's checkpoint when the bundle carries a later one."""
    if named is None:
        return None
    try:
        old = parse_checkpoint(parse_note(named).text).size
    except BundleFormatError:
        return None
    return old if old < size else None


def _consistency_from(old: int | None, size: int, node: GetNode) -> list[str] | None:
    """A proof from the verdict's checkpoint (of size ``old``) to the bundle's, when it is older."""
    if old is None:
        return None
    return [base64.b64encode(h).decode("ascii") for h in consistency_proof(old, size, node)]


def _predicate_checkpoint(envelope: bytes) -> bytes | None:
    try:
        statement: Any = json.loads(parse_envelope(envelope).payload)
        text: Any = statement["predicate"]["checkpoint"]
    except (ValueError, KeyError, TypeError, BundleFormatError):
        return None
    return text.encode("utf-8") if isinstance(text, str) else None


# -- verification -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BundleReport:
    """What verifying a bundle found: counts and facts when ``ok``, the first failure otherwise.

    ``step`` is the B-step of docs/ledger-format.md that failed; ``exit_code`` is 0, 1 (does not
    verify) or 2 (cannot be parsed).
    """

    ok: bool
    session: str | None = None
    entries: int = 0
    head: str | None = None
    origin: str | None = None
    checkpoint_size: int | None = None
    checkpoint_root: str | None = None
    verdict: str | None = None
    vkey_trusted: bool | None = None
    blobs_checked: int = 0
    blobs_absent: int = 0
    step: str | None = None
    reason: str | None = None
    message: str | None = None
    seq: int | None = None
    index: int | None = None
    exit_code: int = 0
    statement: dict[str, Any] | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ok": self.ok,
            "session": self.session,
            "entries": self.entries,
            "head": self.head,
            "origin": self.origin,
            "checkpoint": {"size": self.checkpoint_size, "root": self.checkpoint_root},
            "verdict": self.verdict,
            "vkey_trusted": self.vkey_trusted,
            "blobs_checked": self.blobs_checked,
            "blobs_absent": self.blobs_absent,
        }
        if not self.ok:
            out.update(step=self.step, reason=self.reason, message=self.message, seq=self.seq, index=self.index)
        return out

    def raise_for_failure(self) -> BundleReport:
        """This report when the bundle verified; else raise ``BundleFormatError`` (it cannot be
        parsed: exit 2) or ``VerificationError`` (it does not verify: exit 1), with its step and reason."""
        if self.ok:
            return self
        error = BundleFormatError if self.exit_code == 2 else VerificationError
        raise error(
            self.message or "the bundle does not verify",
            remedy="do not trust this bundle; ask its sender for the original",
            step=self.step,
            reason=self.reason,
            session=self.session,
            seq=self.seq,
            index=self.index,
        )


class _StepFailed(Exception):
    def __init__(self, step: str, error: TrussError) -> None:
        super().__init__(error.message)
        self.step = step
        self.error = error


def verify_bundle(data: bytes, trusted: TrustedKeys) -> BundleReport:
    """Run steps B1-B8 over ``data``; never raises for bad or tampered input."""
    facts: dict[str, Any] = {}
    try:
        return _verify(data, trusted, facts)
    except _StepFailed as failed:
        err = failed.error
        seq, index = err.fields.get("seq"), err.fields.get("index")
        return BundleReport(
            ok=False,
            step=failed.step,
            reason=str(err.fields.get("reason") or err.kind),
            message=err.message,
            seq=seq if isinstance(seq, int) else None,
            index=index if isinstance(index, int) else None,
            exit_code=err.exit_code,
            **facts,
        )


def check_bundle(data: bytes, trusted: TrustedKeys) -> BundleReport:
    """``verify_bundle`` that raises: ``BundleFormatError`` (unparseable) or ``VerificationError``."""
    return verify_bundle(data, trusted).raise_for_failure()


def _verify(data: bytes, trusted: TrustedKeys, facts: dict[str, Any]) -> BundleReport:
    # B1: bounds, JSON, format tag and version, field types.
    doc = _step("B1", lambda: _parse_bundle(data))
    session: str = doc["session"]
    origin: str = doc["origin"]
    facts.update(session=session, origin=origin)

    # B2: the key the bundle names is only reported; ``trusted`` alone decides, and the key
    # history the bundle carries is followed from it (each statement signed by a trusted key).
    facts["vkey_trusted"] = _vkey_trusted(doc["vkey"], trusted)
    statements = _step("B2", lambda: bundle_key_history(doc, origin))
    history = _step("B2", lambda: follow_rotations([e for e, _ in statements], trusted, origin=origin))
    trusted = history.trusted

    # B3: the checkpoint is a signed note by a key named after the origin (and allowed to sign at
    # its size), no extensions; every rotation statement is a leaf of it.
    note_bytes = _step("B3", lambda: _utf8(doc["checkpoint"], "a bundle's checkpoint", "bad_note"))
    size_claimed = _step("B3", lambda: parse_checkpoint(parse_note(note_bytes).text).size)
    signers = history.checkpoint_keys(size_claimed) if history.rotations else list(trusted)
    checkpoint = _step("B3", lambda: open_checkpoint(note_bytes, signers, origin=origin))
    facts.update(checkpoint_size=checkpoint.size, checkpoint_root=checkpoint.root.hex())
    for entry, proof in statements:
        if entry.index >= checkpoint.size or not verify_inclusion(
            leaf_hash(entry.raw), entry.index, checkpoint.size, proof, checkpoint.root
        ):
            raise _StepFailed(
                "B3", _fail(f"the rotation statement at log index {entry.index} is not in the checkpoint", "not_in_log")
            )

    # B4: the entries form one session's chain (verify.V1-V11), each entry is the leaf at its
    # index in the checkpointed tree (V12: every entry, not only the ends).
    entries = _step("B4", lambda: [StoredEntry.from_json(item) for item in doc["entries"]])
    inclusion: list[list[bytes]] = doc["inclusion"]
    if len(inclusion) != len(entries):
        raise _StepFailed("B4", _fail("the bundle holds a different number of proofs than entries", "proof_count"))
    proof_of = {id(e): p for e, p in zip(entries, inclusion, strict=True)}

    def in_log(item: StoredEntry) -> tuple[str, str] | None:
        index = item.index
        if index >= checkpoint.size:
            return (
                "not_in_log",
                f"entry {item.seq}: log index {index} is beyond the checkpoint of size {checkpoint.size}",
            )
        if not verify_inclusion(leaf_hash(item.raw), index, checkpoint.size, proof_of[id(item)], checkpoint.root):
            return "not_in_log", f"entry {item.seq}: it is not the leaf at log index {index} of the checkpointed tree"
        return None

    blobs: dict[str, bytes] = doc["blobs"]
    checks = [in_log, history.check] if history.rotations else [in_log]
    report = verify_entries(entries, trusted, blobs=blobs.get, session=session, origin=origin, extra=checks)
    if not report.ok:
        raise _StepFailed("B4", report.error())
    if not entries:
        raise _StepFailed("B4", _fail("the bundle holds no entries", "empty"))
    head = entries[-1]
    facts.update(entries=len(entries), head=head.hash)
    facts.update(blobs_checked=report.blobs_checked, blobs_absent=report.blobs_absent)

    # B5: the tlog-proof proves the head's inclusion in the same checkpoint.
    proof = _step("B5", lambda: parse_tlog_proof(doc["proof"]))
    if proof.checkpoint != note_bytes:
        raise _StepFailed("B5", _fail("the tlog-proof carries another checkpoint than the bundle", "proof_checkpoint"))
    if proof.index != head.index or not verify_inclusion(
        leaf_hash(head.raw), proof.index, checkpoint.size, proof.hashes, checkpoint.root
    ):
        raise _StepFailed(
            "B5",
            _fail(f"the tlog-proof does not prove the session head (log index {head.index})", "bad_inclusion_proof"),
        )

    # B6: every payload is named by an entry (V11 checked each against its ref).
    named = {ref for e in entries for ref in iter_refs(e.body)}
    stray = sorted(set(blobs) - named)
    if stray:
        raise _StepFailed("B6", _fail(f"payload {stray[0][:19]}... is not named by any entry", "unreferenced_blob"))

    # B7: the verdict envelope is signed by a trusted key, about this session and this head.
    statement: VerdictStatement | None = None
    if doc["envelope"] is not None:
        opened = _step(
            "B7",
            lambda: history.open_verdict(doc["envelope"], session=session, head=head.hash, head_index=head.index),
        )
        _step("B7", lambda: _verdict_agrees(opened, entries))
        facts["verdict"] = opened.status
        statement = opened

        # B8: the checkpoint the verdict names and the bundle's describe one log (no fork).
        if opened.checkpoint is not None:
            _step("B8", lambda: _same_log(opened, checkpoint, history, doc["consistency"]))

    return BundleReport(ok=True, statement=None if statement is None else statement.statement, **facts)


def _step(step: str, action: Callable[[], _T]) -> _T:
    try:
        return action()
    except (VerificationError, InputError) as exc:
        raise _StepFailed(step, exc) from exc


def _parse_bundle(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_BUNDLE_BYTES:
        raise _format(f"a bundle is at most {MAX_BUNDLE_BYTES} bytes, this one is {len(data)}", "too_large")
    try:
        # The parser's recursion limit bounds nesting (RecursionError, not a crash); entry bodies
        # are held to the canonical encoder's 128 levels when each entry is read (B4).
        value: Any = json.loads(data)
    except RecursionError:
        raise _format("a bundle nests too deeply to be read", "too_deep") from None
    except ValueError:
        raise _format("a bundle is one JSON object", "not_json") from None
    doc = as_dict(value)
    if doc is None:
        raise _format("a bundle is one JSON object", "not_json")
    if doc.get("format") != BUNDLE_FORMAT:
        raise _format(f"not a Truss bundle (format is not {BUNDLE_FORMAT!r})", "wrong_format")
    if doc.get("version") != BUNDLE_VERSION:
        raise _format(f"bundle version {doc.get('version')!r} is not supported (expected 1)", "wrong_version")
    unknown = sorted(set(doc) - _BUNDLE_KEYS - _OPTIONAL_KEYS)
    missing = sorted(_BUNDLE_KEYS - set(doc))
    if unknown or missing:
        raise _format(f"bundle fields: unknown {unknown}, missing {missing}", "bad_fields")
    for name in ("origin", "session", "vkey", "checkpoint", "proof"):
        if not isinstance(doc[name], str) or not doc[name]:
            raise _format(f"a bundle's {name} is a non-empty string", "bad_fields")
    if not isinstance(doc["payloads"], bool):
        raise _format("a bundle's payloads flag is true or false", "bad_fields")
    entries = as_list(doc["entries"])
    if entries is None or len(entries) > MAX_BUNDLE_ENTRIES:
        raise _format(f"a bundle's entries are a list of at most {MAX_BUNDLE_ENTRIES}", "bad_fields")
    if doc["envelope"] is not None and not isinstance(doc["envelope"], dict):
        raise _format("a bundle's envelope is an object or null", "bad_fields")
    doc["blobs"] = _decode_blobs(doc["blobs"])
    doc["inclusion"] = _decode_proofs(doc["inclusion"])
    consistency: Any = doc["consistency"]
    doc["consistency"] = None if consistency is None else _decode_hashes(consistency)
    return doc


def _decode_blobs(value: Any) -> dict[str, bytes]:
    items = as_dict(value)
    if items is None:
        raise _format("a bundle's blobs are an object of ref -> base64", "bad_fields")
    out: dict[str, bytes] = {}
    for ref, data in items.items():
        if not isinstance(data, str):  # the refs are JSON object keys: strings
            raise _format("a bundle's blobs are an object of ref -> base64", "bad_fields")
        out[ref] = _b64(data, "bad_fields")
    return out


def _decode_hashes(value: Any) -> list[bytes]:
    items = as_list(value)
    if items is None or len(items) > 64:
        raise _format("a proof is a list of at most 64 base64 hashes", "bad_proof")
    hashes = [_b64(h, "bad_proof") if isinstance(h, str) else b"" for h in items]
    if any(len(h) != HASH_SIZE for h in hashes):
        raise _format("a proof holds base64 SHA-256 hashes", "bad_proof")
    return hashes


def _decode_proofs(value: Any) -> list[list[bytes]]:
    items = as_list(value)
    if items is None:
        raise _format("a bundle's inclusion proofs are a list, one per entry", "bad_proof")
    return [_decode_hashes(p) for p in items]


def _vkey_trusted(vkey: str, trusted: TrustedKeys) -> bool:
    try:
        key = VerifierKey.parse(vkey)
    except InputError:
        return False
    return key in trusted.get(key.key_id)


def _verdict_agrees(statement: VerdictStatement, entries: Sequence[StoredEntry]) -> None:
    recorded = [e for e in entries if e.kind == "verdict"]
    if not recorded:
        return
    status = recorded[-1].body.get("status")
    if status != statement.status:
        raise _fail(
            f"the verdict envelope says {statement.status!r} but the session recorded {status!r}", "verdict_mismatch"
        )


def _same_log(
    statement: VerdictStatement, checkpoint: Checkpoint, history: KeyHistory, consistency: list[bytes] | None
) -> None:
    assert statement.checkpoint is not None
    note = _utf8(statement.checkpoint, "the verdict envelope's checkpoint", "bad_note")
    # As in B3, only a key allowed at its size: one rotated away before it does not sign for the
    # log, so a checkpoint it signed is not the log's, and no evidence of a fork.
    size = parse_checkpoint(parse_note(note).text).size
    signers = history.checkpoint_keys(size) if history.rotations else list(history.trusted)
    named = open_checkpoint(note, signers, origin=checkpoint.origin)
    if named.size == checkpoint.size:
        if named.root != checkpoint.root:
            raise _fail(
                f"two checkpoints of size {named.size} with different roots: the log was forked",
                "fork",
                size=named.size,
            )
        return
    small, large = sorted((named, checkpoint), key=lambda cp: cp.size)
    if consistency is None or not verify_consistency(small.size, large.size, small.root, large.root, consistency):
        raise _fail(
            f"the checkpoints of size {small.size} and {large.size} are not proven to be one log",
            "inconsistent_checkpoints",
        )


# -- helpers ---------------------------------------------------------------------------------


def _fail(message: str, reason: str, **fields: Any) -> VerificationError:
    return VerificationError(message, remedy="do not trust this bundle", reason=reason, **fields)


def _format(message: str, reason: str) -> BundleFormatError:
    return BundleFormatError(message, remedy="obtain the bundle again from its source", reason=reason)


def _utf8(text: str, what: str, reason: str) -> bytes:
    """``text`` as UTF-8; a lone surrogate (JSON's ``\\ud800``, which ``json.loads`` accepts) is bad input."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = ord(text[exc.start])
        raise _format(f"{what} is not Unicode text: it holds a lone surrogate (U+{bad:04X})", reason) from None


def _b64(text: str, reason: str) -> bytes:
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise _format("expected standard, padded base64", reason) from None
    if base64.b64encode(raw).decode("ascii") != text:
        # One byte string, one spelling: no second encoding of the same proof or payload.
        raise _format("expected canonical base64 (unused bits zero)", reason)
    return raw
