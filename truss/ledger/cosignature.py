"""C2SP tlog-cosignature v1: the signed messages, cosignature lines, and checking them on a checkpoint.

A cosignature is a signed-note signature line on a checkpoint, by a cosigner (a witness) stating
that, as of its timestamp, this is the largest consistent tree of the log it has seen. Its bytes
are ``key id (4) || timestamp (u64 big-endian) || signature``:

- Ed25519 (signature type 0x04): the signature covers ``"cosignature/v1\\n" "time <ts>\\n"``
  followed by the whole checkpoint body (``ed25519_message``).
- ML-DSA-44 (0x06): the signature covers the ``cosigned_message`` structure: the label
  ``"subtree/v1\\n\\0"``, the cosigner name, the timestamp, the origin, ``start`` 0, ``end`` (the
  tree size) and the root (``mldsa_message``). It commits to the cosigner's name.

Verification rules (``verify_cosignatures``), after signed-note: a signature line whose (name, key
id) is not a configured cosigner's is ignored; one that is, and does not verify, rejects the note
(``bad_cosignature``); a zero timestamp is refused (a witness must not omit it).

Sans-IO: the keys come in as objects (``keys.CosignerKey`` signs, ``keys.CosignerVerifier``
verifies); this module builds bytes and checks them. What it does not do: decide which cosigners
count (``tlog_policy``) or talk to witnesses (``witness`` builds the requests, ``truss.witness``
sends them).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from truss._errors import BundleFormatError, VerificationError
from truss.ledger.keys import ED25519_COSIGNATURE_ALG, MLDSA44_COSIGNATURE_ALG
from truss.ledger.note import (
    Checkpoint,
    Note,
    NoteSignature,
    StoredCheckpointLike,
    parse_checkpoint,
    parse_note,
)

__all__ = [
    "COSIGNATURE_HEADER",
    "MAX_TIMESTAMP",
    "SUBTREE_LABEL",
    "Cosignature",
    "CosignatureSigner",
    "CosignatureVerifier",
    "checkpoint_of",
    "cosign",
    "ed25519_message",
    "has_cosignatures",
    "merge_notes",
    "mldsa_message",
    "verify_cosignatures",
    "with_signature_lines",
    "witnessed_checkpoint",
]

COSIGNATURE_HEADER = "cosignature/v1\n"
SUBTREE_LABEL = b"subtree/v1\n\x00"
MAX_TIMESTAMP = 2**63 - 1
_SIGNATURE_BYTES = {ED25519_COSIGNATURE_ALG: 64, MLDSA44_COSIGNATURE_ALG: 2420}


class CosignatureSigner(Protocol):
    """A cosigner's private key (``keys.CosignerKey``): name, hex key id, type byte, ``sign``."""

    @property
    def name(self) -> str: ...

    @property
    def key_id(self) -> str: ...

    @property
    def alg(self) -> int: ...

    def sign(self, message: bytes) -> bytes: ...


class CosignatureVerifier(Protocol):
    """A cosigner's public key (``keys.CosignerVerifier``)."""

    @property
    def name(self) -> str: ...

    @property
    def key_id(self) -> str: ...

    @property
    def alg(self) -> int: ...

    def verify(self, message: bytes, signature: bytes) -> bool: ...


@dataclass(frozen=True)
class Cosignature:
    """One verified cosignature: who (``name``, hex ``key_id``, ``alg``), when, and its note line.

    ``verifier`` is the given cosigner key it verified under: the one thing that says whose it is,
    since a key id is 4 bytes and another key can be ground to share a name and key id with it.
    """

    name: str
    key_id: str
    alg: int
    timestamp: int
    line: str
    verifier: CosignatureVerifier | None = field(default=None, compare=False, repr=False)


def ed25519_message(checkpoint_text: str, timestamp: int) -> bytes:
    """The message an Ed25519 (type 0x04) cosignature signs: header, time line, checkpoint body."""
    _check_timestamp(timestamp)
    return f"{COSIGNATURE_HEADER}time {timestamp}\n{checkpoint_text}".encode()


def mldsa_message(cosigner: str, timestamp: int, origin: str, size: int, root: bytes) -> bytes:
    """The ``cosigned_message`` an ML-DSA-44 (type 0x06) cosignature signs, for the whole tree."""
    _check_timestamp(timestamp)
    name, log = cosigner.encode(), origin.encode()
    if not 1 <= len(name) <= 255 or not 1 <= len(log) <= 255:
        raise ValueError("a cosigner name and a log origin are 1 to 255 bytes in a cosigned_message")
    if len(root) != 32:
        raise ValueError("a root hash is 32 bytes")
    return b"".join(
        (
            SUBTREE_LABEL,
            bytes([len(name)]),
            name,
            struct.pack(">Q", timestamp),
            bytes([len(log)]),
            log,
            struct.pack(">QQ", 0, size),
            root,
        )
    )


def _message(alg: int, cosigner: str, checkpoint_text: str, timestamp: int) -> bytes:
    if alg == ED25519_COSIGNATURE_ALG:
        return ed25519_message(checkpoint_text, timestamp)
    body = parse_checkpoint(checkpoint_text)
    return mldsa_message(cosigner, timestamp, body.origin, body.size, body.root)


def cosign(checkpoint_text: str, key: CosignatureSigner, timestamp: int) -> NoteSignature:
    """The cosignature line ``key`` makes on the checkpoint body ``checkpoint_text`` at ``timestamp``."""
    if timestamp <= 0:
        raise ValueError("a witness's cosignature carries a non-zero timestamp")
    signature = key.sign(_message(key.alg, key.name, checkpoint_text, timestamp))
    return NoteSignature(key.name, bytes.fromhex(key.key_id), struct.pack(">Q", timestamp) + signature)


def verify_cosignatures(note: Note | bytes, cosigners: Iterable[CosignatureVerifier]) -> list[Cosignature]:
    """The cosignatures on ``note`` by the given cosigners, each verified; unknown lines are ignored.

    Raises ``VerificationError`` (``reason`` ``bad_cosignature``, ``witness``) when a line by a
    given cosigner does not verify or has a zero or out-of-range timestamp, and
    ``BundleFormatError`` when the note cannot be parsed.
    """
    parsed = parse_note(note) if isinstance(note, bytes) else note
    by_id: dict[tuple[str, bytes], list[CosignatureVerifier]] = {}
    for cosigner in cosigners:
        by_id.setdefault((cosigner.name, bytes.fromhex(cosigner.key_id)), []).append(cosigner)
    found: list[Cosignature] = []
    for sig in parsed.signatures:
        candidates = by_id.get((sig.name, sig.key_id))
        if not candidates:
            continue
        verified = None
        for cosigner in candidates:
            checked = _check_one(parsed.text, sig, cosigner)
            if checked is not None:
                verified = checked
                break
        if verified is None:
            raise VerificationError(
                f"the cosignature by witness {sig.name} ({sig.key_id.hex()}) does not verify",
                remedy="the checkpoint or its cosignature was altered, or the witness key is not the one it used",
                reason="bad_cosignature",
                witness=sig.name,
                key_id=sig.key_id.hex(),
            )
        found.append(verified)
    return found


def _check_one(text: str, sig: NoteSignature, cosigner: CosignatureVerifier) -> Cosignature | None:
    expected = _SIGNATURE_BYTES.get(cosigner.alg)
    if expected is None or len(sig.signature) != 8 + expected:
        return None
    (timestamp,) = struct.unpack(">Q", sig.signature[:8])
    if not 0 < timestamp <= MAX_TIMESTAMP:
        return None
    try:
        message = _message(cosigner.alg, cosigner.name, text, timestamp)
    except (ValueError, BundleFormatError):
        return None
    if not cosigner.verify(message, sig.signature[8:]):
        return None
    return Cosignature(sig.name, cosigner.key_id, cosigner.alg, timestamp, sig.line(), cosigner)


def with_signature_lines(note: bytes, lines: Iterable[NoteSignature]) -> bytes:
    """``note`` with ``lines`` added; a line by a (name, key id) already on the note replaces it.

    The log's own signature stays first; the text is untouched, so the log signature still
    verifies. Used to keep a witness's cosignature with the checkpoint it signed.
    """
    parsed = parse_note(note)
    merged: dict[tuple[str, bytes], NoteSignature] = {(s.name, s.key_id): s for s in parsed.signatures}
    for line in lines:
        merged[(line.name, line.key_id)] = line
    return Note(text=parsed.text, signatures=tuple(merged.values())).to_bytes()


def merge_notes(held: str, new: str) -> str:
    """``held`` with the signature lines of ``new`` added, when both are notes of the same text.

    What a store keeps when a checkpoint it holds comes back with cosignatures. Anything that
    does not parse, or a note of another text, leaves ``held`` as it is; so does a merge that
    would pass the bound on signature lines.
    """
    try:
        old_note, new_note = parse_note(held.encode("utf-8")), parse_note(new.encode("utf-8"))
    except BundleFormatError:
        return held
    if old_note.text != new_note.text:
        return held
    merged = with_signature_lines(held.encode("utf-8"), new_note.signatures)
    try:
        parse_note(merged)
    except BundleFormatError:
        return held
    return merged.decode("utf-8")


def has_cosignatures(note: bytes) -> bool:
    """Whether ``note`` carries a signature line by a key other than its log's (a cosignature)."""
    try:
        parsed = parse_note(note)
        origin = parse_checkpoint(parsed.text).origin
    except BundleFormatError:
        return False
    return any(sig.name != origin for sig in parsed.signatures)


WITNESSED_LOOKAHEAD = 64
"""How many later stored checkpoints a bundle looks through for a witnessed one (each one lookup)."""


def witnessed_checkpoint(
    covering: Callable[[int], StoredCheckpointLike | None], chosen: bytes, head_index: int
) -> bytes:
    """The note a bundle carries for ``chosen`` (covering log index ``head_index``): the stored
    version with its cosignatures, or, when that one was never witnessed, the earliest later
    stored checkpoint that was, among the next ``WITNESSED_LOOKAHEAD``; else ``chosen`` itself.

    ``covering(n)`` is the store's ``checkpoint_covering``: the smallest stored checkpoint of at
    least ``n`` entries. Each step is one index lookup, so the export of a session costs the same
    however many checkpoints the ledger holds; a session end submits its checkpoint to the
    witnesses, so a witnessed one is the same or the next few, and a ledger that is not witnessed
    pays the bounded look-ahead.
    """
    body = checkpoint_of(chosen)
    same = covering(body.size)
    held = chosen if same is None or (same.size, same.root) != (body.size, body.root) else same.note.encode("utf-8")
    if has_cosignatures(held):
        return held
    cursor = max(body.size, head_index) + 1
    for _ in range(WITNESSED_LOOKAHEAD):
        cp = covering(cursor)
        if cp is None:
            break
        if has_cosignatures(cp.note.encode("utf-8")):
            return cp.note.encode("utf-8")
        cursor = cp.size + 1
    return held


def checkpoint_of(note: bytes) -> Checkpoint:
    """The body of a signed checkpoint note (form only; signatures are not checked here)."""
    return parse_checkpoint(parse_note(note).text)


def _check_timestamp(timestamp: int) -> None:
    if not 0 <= timestamp <= MAX_TIMESTAMP:
        raise ValueError(f"timestamp {timestamp} is out of range")
