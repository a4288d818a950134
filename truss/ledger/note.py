"""C2SP signed notes (signed-note v1.0.0) and transparency-log checkpoints (tlog-checkpoint v1.0.0).

A signed note is a UTF-8 text ending in a newline, a blank line, then one signature line per
signer: ``— <key name> <base64(key id || signature)>``. The key id is
``SHA-256(name || 0x0A || 0x01 || public key)[:4]`` for Ed25519 (algorithm byte 0x01), and a
verifier key is written ``<name>+<hex key id>+<base64(0x01 || public key)>``.

Verification rules (``open_note``): signatures by keys the caller does not trust (by name *and*
key id) are ignored; a signature by a trusted key that fails rejects the note; at least one
trusted signature must verify. A checkpoint is the note text ``<origin>\\n<size>\\n<base64
root>\\n`` optionally followed by extension lines; Truss never writes extension lines, the parser
reports any it finds, and ``open_checkpoint`` refuses them unless asked not to.

This module is sans-IO and does no cryptography itself: signing and Ed25519 verification go
through the ``NoteSigner`` / ``NoteVerifier`` protocols, which the ledger's key objects satisfy
(PyNaCl is imported in ``keys`` only). What it does not do: decide which keys are trusted, or
store checkpoints (the store and the bundle verifier do).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from truss._errors import BundleFormatError, VerificationError
from truss.ledger.merkle import consistency_nodes, consistency_proof, fetched, verify_consistency

__all__ = [
    "MAX_NOTE_BYTES",
    "MAX_SIGNATURES",
    "Checkpoint",
    "CheckpointPublisher",
    "CheckpointStore",
    "Note",
    "NoteSignature",
    "NoteSigner",
    "NoteVerifier",
    "covering_checkpoint",
    "format_checkpoint",
    "is_origin",
    "open_checkpoint",
    "open_note",
    "parse_checkpoint",
    "parse_note",
    "sign_checkpoint",
    "sign_checkpoint_note",
    "sign_note",
]

MAX_NOTE_BYTES = 64 * 1024
MAX_SIGNATURES = 100
_DASH = "\u2014 "  # "— ": an em dash and a space start every signature line
_MAX_TREE_SIZE = 2**63 - 1


class NoteSigner(Protocol):
    """Something that signs note texts (``keys.IdentityKey`` is one).

    ``name`` is the key name, ``key_id`` the 8 hex digits of the 4-byte signed-note key id.
    """

    @property
    def name(self) -> str: ...

    @property
    def key_id(self) -> str: ...

    def sign(self, message: bytes) -> bytes:
        """The raw signature (64 bytes for Ed25519) over ``message``."""
        ...


class NoteVerifier(Protocol):
    """A trusted key (``keys.VerifierKey`` is one): ``name``, hex ``key_id``, ``verify``."""

    @property
    def name(self) -> str: ...

    @property
    def key_id(self) -> str: ...

    def verify(self, message: bytes, signature: bytes) -> bool: ...


# -- notes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoteSignature:
    """One signature line: who (``name``, ``key_id``) and the raw ``signature`` bytes."""

    name: str
    key_id: bytes
    signature: bytes

    def line(self) -> str:
        return f"{_DASH}{self.name} {base64.b64encode(self.key_id + self.signature).decode()}\n"


@dataclass(frozen=True)
class Note:
    """A note's ``text`` (ends in a newline) and its signature lines, in order."""

    text: str
    signatures: tuple[NoteSignature, ...]

    def to_bytes(self) -> bytes:
        return (self.text + "\n" + "".join(s.line() for s in self.signatures)).encode()


# One scan in C: an export parses up to 65 stored notes (cosignature.WITNESSED_LOOKAHEAD), and a
# scan char by char in Python was most of its time.
_CONTROL_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f]")


def parse_note(data: bytes) -> Note:
    """Split a signed note into text and signature lines; checks form only, not signatures."""
    if len(data) > MAX_NOTE_BYTES:
        raise _format_error(f"a signed note is at most {MAX_NOTE_BYTES} bytes, this one is {len(data)}", "too_large")
    try:
        whole = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _format_error("a signed note is UTF-8 text", "bad_note") from None
    # C2SP bans characters below U+0020 but newline anywhere in a note. Truss also refuses DEL in
    # the text, but not in a signature line: a foreign cosigner's name may hold one, and an
    # unknown signer's line is ignored, not a reason to refuse the note.
    if _CONTROL_BUT_NEWLINE.search(whole) is not None:
        raise _format_error("a signed note holds no control characters but newlines", "bad_note")
    split = whole.rfind("\n\n")
    if split < 0:
        raise _format_error("a signed note has a blank line between its text and its signatures", "bad_note")
    text, block = whole[: split + 1], whole[split + 2 :]
    if "\x7f" in text:
        raise _format_error("a signed note's text holds no control characters but newlines", "bad_note")
    if not block.endswith("\n") or not block.strip("\n"):
        raise _format_error("a signed note ends in at least one signature line and a newline", "bad_note")
    lines = block[:-1].split("\n")
    if len(lines) > MAX_SIGNATURES:
        raise _format_error(f"a signed note carries at most {MAX_SIGNATURES} signatures", "too_many_signatures")
    signatures: list[NoteSignature] = []
    for line in lines:
        if not line.startswith(_DASH):
            raise _format_error("each signature line starts with '— ' (an em dash and a space)", "bad_note")
        name, sep, b64 = line[len(_DASH) :].partition(" ")
        if not sep or " " in b64:
            raise _format_error("a signature line is '— <key name> <base64 signature>'", "bad_note")
        _check_key_name(name)
        raw = _b64decode(b64, "bad_note")
        if len(raw) < 5:
            raise _format_error("a note signature holds a 4-byte key id and a signature", "bad_note")
        signatures.append(NoteSignature(name=name, key_id=raw[:4], signature=raw[4:]))
    return Note(text=text, signatures=tuple(signatures))


def sign_note(text: str, signers: Sequence[NoteSigner]) -> bytes:
    """A signed note of ``text`` (which must end in a newline) by each of ``signers``."""
    _check_text(text)
    if not signers:
        raise ValueError("a signed note needs at least one signer")
    message = text.encode()
    signatures: list[NoteSignature] = []
    for signer in signers:
        _check_key_name(signer.name)
        signatures.append(NoteSignature(signer.name, _key_id_bytes(signer.key_id), signer.sign(message)))
    return Note(text=text, signatures=tuple(signatures)).to_bytes()


def open_note(data: bytes, verifiers: Iterable[NoteVerifier]) -> tuple[Note, list[NoteSignature]]:
    """Parse and verify a note against the trusted ``verifiers``.

    Returns the note and the signatures that verified. Raises ``BundleFormatError`` for a note
    that cannot be parsed and ``VerificationError`` (``reason`` ``bad_signature`` with
    ``key_name``, or ``no_trusted_signature``) when the signature rules are not met.
    """
    note = parse_note(data)
    _check_text(note.text)
    trusted: dict[tuple[str, bytes], list[NoteVerifier]] = {}
    for verifier in verifiers:
        trusted.setdefault((verifier.name, _key_id_bytes(verifier.key_id)), []).append(verifier)
    message = note.text.encode()
    verified: list[NoteSignature] = []
    for sig in note.signatures:
        candidates = trusted.get((sig.name, sig.key_id))
        if candidates is None:
            continue  # an unknown key, even one sharing a known name, is ignored
        if not any(v.verify(message, sig.signature) for v in candidates):
            raise VerificationError(
                f"the note's signature by trusted key {sig.name} ({sig.key_id.hex()}) does not verify",
                remedy="the note was altered or signed by someone else under that key name; do not trust it",
                reason="bad_signature",
                key_name=sig.name,
                key_id=sig.key_id.hex(),
            )
        verified.append(sig)
    if not verified:
        names = sorted({s.name for s in note.signatures})
        raise VerificationError(
            f"no signature on the note is by a trusted key (signed by: {', '.join(names)})",
            remedy="pass the log's verifier key with --trusted-key, or obtain the note from the log you trust",
            reason="no_trusted_signature",
            signers=names,
        )
    return note, verified


# -- checkpoints -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """A tlog-checkpoint body: ``origin``, tree ``size``, ``root`` hash, and any ``extensions``.

    ``note`` is the signed note it came from (or was signed into), when there is one.
    """

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()
    note: bytes | None = None

    def text(self) -> str:
        """The body as signed: origin, size and root, then its extension lines, if any (a
        cosignature covers them too, so a body without them is not what the log signed)."""
        return format_checkpoint(self.origin, self.size, self.root) + "".join(f"{line}\n" for line in self.extensions)


def format_checkpoint(origin: str, size: int, root: bytes) -> str:
    """The checkpoint body Truss writes: origin, size and root, no extension lines."""
    if not is_origin(origin):
        raise ValueError("a checkpoint origin is non-empty and holds no spaces or control characters")
    if not 0 <= size <= _MAX_TREE_SIZE:
        raise ValueError(f"tree size {size} is out of range")
    if len(root) != 32:
        raise ValueError("a checkpoint root is a 32-byte SHA-256 hash")
    return f"{origin}\n{size}\n{base64.b64encode(root).decode()}\n"


def is_origin(name: str) -> bool:
    """Whether ``name`` can be the origin line of a checkpoint Truss signs, and so a log's name.

    Non-empty, with no space and no control character: nothing below U+0021, and no DEL. The key
    that signs a log's checkpoints is named after it, so ``IdentityKey.create`` applies this too.
    """
    return bool(name) and not any(ord(ch) < 0x21 or ch == "\x7f" for ch in name)


def parse_checkpoint(text: str) -> Checkpoint:
    """Parse a checkpoint body; extension lines are returned in ``extensions``, not refused."""
    if not text.endswith("\n"):
        raise _format_error("a checkpoint body ends in a newline", "bad_checkpoint")
    lines = text[:-1].split("\n")
    if len(lines) < 3:
        raise _format_error("a checkpoint has an origin line, a size line and a root line", "bad_checkpoint")
    origin, size_text, root_text, *extensions = lines
    if not origin or any(ord(ch) < 0x21 for ch in origin):
        raise _format_error("a checkpoint's origin line is non-empty and has no spaces", "bad_checkpoint")
    if not size_text.isascii() or not size_text.isdigit() or (size_text != "0" and size_text.startswith("0")):
        raise _format_error("a checkpoint's size is a decimal number without leading zeros", "bad_checkpoint")
    if len(size_text) > 19 or int(size_text) > _MAX_TREE_SIZE:
        raise _format_error("a checkpoint's size is out of range", "bad_checkpoint")
    root = _b64decode(root_text, "bad_checkpoint")
    if len(root) != 32:
        raise _format_error("a checkpoint's root is the base64 of a 32-byte hash", "bad_checkpoint")
    if any(not line for line in extensions):
        raise _format_error("a checkpoint's extension lines are non-empty", "bad_checkpoint")
    return Checkpoint(origin=origin, size=int(size_text), root=root, extensions=tuple(extensions))


def sign_checkpoint_note(origin: str, size: int, root: bytes, signer: NoteSigner) -> Checkpoint:
    """Sign a checkpoint of ``origin`` (which must be the signer's key name) at ``size``/``root``."""
    if signer.name != origin:
        raise ValueError(f"a checkpoint of {origin!r} is signed by the key named after it, not {signer.name!r}")
    text = format_checkpoint(origin, size, root)
    return Checkpoint(origin=origin, size=size, root=root, note=sign_note(text, [signer]))


def open_checkpoint(
    data: bytes,
    verifiers: Iterable[NoteVerifier],
    *,
    origin: str | None = None,
    allow_extensions: bool = False,
) -> Checkpoint:
    """Verify a signed checkpoint note and parse its body.

    A trusted signature whose key name is the checkpoint's origin must verify (a key trusted
    for another log does not vouch for this one). Extension lines are refused (``reason``
    ``checkpoint_extensions``) unless ``allow_extensions``; ``origin``, when given, must match
    (``origin_mismatch``).
    """
    note, verified = open_note(data, verifiers)
    checkpoint = parse_checkpoint(note.text)
    if not any(sig.name == checkpoint.origin for sig in verified):
        raise VerificationError(
            f"checkpoint of {checkpoint.origin!r} is not signed by a trusted key named after that origin",
            remedy="pass the verifier key of the log that issued the checkpoint",
            reason="no_trusted_signature",
            origin=checkpoint.origin,
        )
    if origin is not None and checkpoint.origin != origin:
        raise VerificationError(
            f"checkpoint is for log {checkpoint.origin!r}, expected {origin!r}",
            remedy="compare checkpoints of the same log",
            reason="origin_mismatch",
            origin=checkpoint.origin,
        )
    if checkpoint.extensions and not allow_extensions:
        raise VerificationError(
            f"checkpoint of {checkpoint.origin!r} at size {checkpoint.size} carries "
            f"{len(checkpoint.extensions)} extension line(s), which Truss never writes",
            remedy="obtain the checkpoint as the log issued it",
            reason="checkpoint_extensions",
            size=checkpoint.size,
        )
    return Checkpoint(
        origin=checkpoint.origin,
        size=checkpoint.size,
        root=checkpoint.root,
        extensions=checkpoint.extensions,
        note=data,
    )


# -- signing over a store -----------------------------------------------------------------------


class StoredCheckpointLike(Protocol):
    @property
    def size(self) -> int: ...

    @property
    def root(self) -> bytes: ...

    @property
    def note(self) -> str: ...


class CheckpointStore(Protocol):
    """What ``sign_checkpoint`` needs from a ledger store (every ``LedgerStore`` is one)."""

    origin: str

    def tree_head(self) -> tuple[int, bytes]: ...

    def node(self, level: int, index: int) -> bytes: ...

    def nodes(self, keys: Sequence[tuple[int, int]]) -> Mapping[tuple[int, int], bytes]: ...

    def checkpoints(self) -> Sequence[StoredCheckpointLike]: ...

    def latest_checkpoint(self) -> StoredCheckpointLike | None: ...

    def checkpoint_covering(self, size: int) -> StoredCheckpointLike | None: ...

    def add_checkpoint(self, size: int, root: bytes, note: str) -> None: ...


@runtime_checkable
class CheckpointPublisher(Protocol):
    """A store shared by many writers that lets one of them sign at a time (PostgreSQL).

    ``publish_checkpoint(covering, sign)`` returns ``None`` when a stored checkpoint already
    covers the first ``covering`` entries; otherwise it calls ``sign`` with a view of the store
    held by the one publisher (throttled to a minimum interval) and returns what it returns.
    """

    def publish_checkpoint(self, covering: int, sign: Callable[[CheckpointStore], Checkpoint]) -> Checkpoint | None: ...


def sign_checkpoint(store: CheckpointStore, key: NoteSigner) -> Checkpoint:
    """Sign, store and return a checkpoint of the store's tree as it is now.

    Refuses (``VerificationError``) to sign a tree that is not an append-only extension of the
    latest stored checkpoint: ``log_shrank`` when a stored checkpoint is larger than the tree,
    ``inconsistent_checkpoint`` when the consistency proof from it fails (the log was rewritten),
    ``bad_stored_checkpoint`` when a stored note does not say what its row says. When the latest
    checkpoint already covers the whole tree, it is returned instead of signing a duplicate.

    On a ``CheckpointPublisher`` the signing happens as that store's one publisher, and the
    result may be a later checkpoint another writer signed that covers the tree as it was when
    this call began.
    """
    if isinstance(store, CheckpointPublisher):
        size, _ = store.tree_head()
        signed = store.publish_checkpoint(size, lambda view: _sign_now(view, key))
        return signed if signed is not None else covering_checkpoint(store, size)
    return _sign_now(store, key)


def covering_checkpoint(store: CheckpointStore, size: int) -> Checkpoint:
    """The latest stored checkpoint, which covers at least ``size`` entries, checked against its row."""
    latest = store.latest_checkpoint()
    if latest is None or latest.size < size:
        raise VerificationError(
            f"no stored checkpoint covers the first {size} entries of the log",
            remedy="the checkpoints table was modified: run `truss ledger verify --all`",
            reason="log_shrank",
            size=size,
        )
    _check_stored(store, latest)
    return Checkpoint(origin=store.origin, size=latest.size, root=latest.root, note=latest.note.encode())


def _check_stored(store: CheckpointStore, latest: StoredCheckpointLike) -> None:
    body = parse_checkpoint(parse_note(latest.note.encode()).text)
    if (body.origin, body.size, body.root) != (store.origin, latest.size, latest.root):
        raise VerificationError(
            f"the stored checkpoint of size {latest.size} does not match its signed note",
            remedy="the checkpoints table was modified: run `truss ledger verify --all`",
            reason="bad_stored_checkpoint",
            size=latest.size,
        )


def _sign_now(store: CheckpointStore, key: NoteSigner) -> Checkpoint:
    # The latest checkpoint first, then the head: the tree only grows, so the checkpoint read here
    # was signed over a size at most the head's, even while other sessions append and sign. One
    # index lookup: the run end costs the same at 20,000 stored checkpoints as at 20.
    latest = store.latest_checkpoint()
    size, root = store.tree_head()
    if latest is not None and latest.size > size:
        raise VerificationError(
            f"the log holds {size} entries but a checkpoint of size {latest.size} was signed before",
            remedy="the ledger was truncated or replaced: restore it, and run `truss ledger verify --all`",
            reason="log_shrank",
            size=size,
        )
    if latest is not None:
        _check_stored(store, latest)
        # One lookup for the proof's nodes: their number grows with log2 of the log, the queries do not.
        proof = consistency_proof(latest.size, size, fetched(store.nodes, consistency_nodes(latest.size, size)))
        if not verify_consistency(latest.size, size, latest.root, root, proof):
            raise VerificationError(
                f"the log of {size} entries is not an extension of the checkpoint of size {latest.size}",
                remedy="entries already covered by a checkpoint were changed: run `truss ledger verify --all`",
                reason="inconsistent_checkpoint",
                size=latest.size,
            )
        if latest.size == size:
            return Checkpoint(origin=store.origin, size=size, root=root, note=latest.note.encode())
    checkpoint = sign_checkpoint_note(store.origin, size, root, key)
    assert checkpoint.note is not None
    store.add_checkpoint(size, root, checkpoint.note.decode())
    return checkpoint


# -- helpers ---------------------------------------------------------------------------------


def _key_id_bytes(hex_id: str) -> bytes:
    raw = bytes.fromhex(hex_id)
    if len(raw) != 4:
        raise ValueError(f"a signed-note key id is 4 bytes, got {hex_id!r}")
    return raw


def _check_key_name(name: str) -> None:
    if not name or "+" in name or any(ch.isspace() for ch in name) or any(ord(ch) < 0x20 for ch in name):
        raise _format_error(f"key name {name!r} is empty or holds '+' or white space", "bad_key_name")


def _check_text(text: str) -> None:
    if not text.endswith("\n"):
        raise _format_error("a note's text is non-empty and ends in a newline", "bad_note")
    if any(ord(ch) < 0x20 and ch != "\n" for ch in text):
        raise _format_error("a note's text holds no control characters but newlines", "bad_note")


def _b64decode(text: str, reason: str) -> bytes:
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise _format_error("expected standard, padded base64", reason) from None
    if base64.b64encode(raw).decode() != text:
        raise _format_error("expected canonical, padded base64", reason)
    return raw


def _format_error(message: str, reason: str) -> BundleFormatError:
    return BundleFormatError(
        message, remedy="obtain the note or key again from its source; it cannot be parsed", reason=reason
    )
