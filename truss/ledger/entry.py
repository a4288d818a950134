"""Ledger entries: the signed record of one step, its canonical bytes, hash and signing payload.

An entry is the JSON object ``{"v", "log", "session", "seq", "index", "ts", "kind", "body",
"prev"}`` (docs/ledger-format.md, section 1). Its bytes are RFC 8785 canonical JSON; its hash is
SHA-256 of those bytes; its signature is Ed25519 over the DSSE v1 pre-authentication encoding
(``pae``) of those bytes with ``PAYLOAD_TYPE``, so an entry signature can never pass for the
signature of anything else Truss signs.

This module is sans-IO: it builds and seals entries from values a store hands it (seq, index,
prev, time) and parses the portable JSON form. It does not assign those values (the store does),
verify chains (``verify``) or touch keys' private bytes (``keys`` signs through ``Signer``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from truss._errors import BundleFormatError, StoreError
from truss._json import as_dict, as_list, loads
from truss.ledger.canonical import CanonicalError, canonical, sha256_ref

__all__ = [
    "ENTRY_FIELDS",
    "ENTRY_VERSION",
    "KINDS",
    "LOG_SESSION_ID",
    "PAYLOAD_TYPE",
    "REF_RE",
    "ZERO_HASH",
    "Record",
    "Signer",
    "StoredEntry",
    "check_record",
    "encode_record",
    "entry_bytes",
    "iter_refs",
    "pae",
    "refs_in",
    "seal",
    "session_status",
    "status_after",
]

ENTRY_VERSION = 1
PAYLOAD_TYPE = "application/vnd.truss.ledger-entry.v1+json"
ZERO_HASH = "0" * 64
ENTRY_FIELDS = frozenset({"v", "log", "session", "seq", "index", "ts", "kind", "body", "prev"})

KINDS: frozenset[str] = frozenset(
    {
        "session_started",
        "model_turn",
        "mcp_tool_intent",
        "mcp_tool_call",
        "mcp_tool_denied",
        "mcp_tool_pending",
        "signal_received",
        "approval_requested",
        "approval_decided",
        "in_doubt",
        "in_doubt_resolved",
        "session_suspended",
        "session_resumed",
        "panel_review",
        "verdict",
        "session_ended",
        "sandbox_egress",
        # The log's own entries, in the reserved session ``@log`` (``keyhistory``).
        "key_rotated",
        "key_admitted",
        "key_removed",
        "checkpoint_witnessed",
        # Quotas across runs, in the reserved session ``@quota`` (``truss.quota``).
        "quota_reserved",
        "quota_settled",
    }
)

# Entries appended while a session waits (a person's decision, a signal, a resolution): the session
# is still waiting for a resume after them.
_WAITING_KINDS = frozenset({"approval_decided", "signal_received", "in_doubt_resolved"})
_STATUS_WORD = re.compile(r"[a-z_]{1,32}")


LOG_SESSION_ID = "@log"
"""The log's own session (``keyhistory.LOG_SESSION``): key rotations and witness outcomes, never a run."""


def session_status(session: str, kind: str, body: Any) -> str:
    """``status_after``, except that the log's own session is always ``log``."""
    return "log" if session == LOG_SESSION_ID else status_after(kind, body)


def status_after(kind: str, body: Any) -> str:
    """A session's status as its last entry says it (docs/ledger-format.md, "the status of a session").

    ``session_ended`` gives the status it records (``pass``, ``fail``, ``error``; ``ended`` when it
    names none); ``session_suspended`` gives ``interrupted`` or ``diverged`` when that is its
    reason, else ``suspended``; an entry recorded while a session waits (a decision, a signal, a
    resolution) leaves it ``suspended``; anything else means ``running``. Stores keep this in their
    session rows and verification checks the rows against it; readers derive it from the verified
    last entry.
    """
    fields: dict[str, Any] = cast(dict[str, Any], body) if isinstance(body, dict) else {}
    if kind == "session_ended":
        status = fields.get("status")
        return status if isinstance(status, str) and _STATUS_WORD.fullmatch(status) else "ended"
    if kind == "session_suspended":
        reason = fields.get("reason")
        return reason if reason in ("interrupted", "diverged") else "suspended"
    if kind in _WAITING_KINDS:
        return "suspended"
    return "running"


REF_RE = re.compile(r"sha256:[0-9a-f]{64}")
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


_STRINGS: dict[str, bytes] = {}  # kind, log and session names as JSON strings: the same few on every append
_STRINGS_KEPT = 4096


def _json_string(text: str) -> bytes:
    """``text`` as the JSON string bytes ``canonical`` writes (for ASCII ``text``), kept once made."""
    encoded = _STRINGS.get(text)
    if encoded is None:
        if len(_STRINGS) >= _STRINGS_KEPT:  # a process that appends to many sessions: stay bounded
            _STRINGS.clear()
        encoded = _STRINGS[text] = _ENCODER.encode(text).encode()
    return encoded


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: ``"DSSEv1" SP len(type) SP type SP len(body) SP body``.

    Lengths are the ASCII decimal byte counts of the UTF-8 type and of the body.
    """
    type_bytes = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(type_bytes), type_bytes, len(body), body)


_ENTRY_PAE_PREFIX = b"DSSEv1 %d %s " % (len(PAYLOAD_TYPE.encode()), PAYLOAD_TYPE.encode())


def entry_signing_payload(raw: bytes) -> bytes:
    """``pae(PAYLOAD_TYPE, raw)``, with the constant prefix built once (it is on the hot path)."""
    return _ENTRY_PAE_PREFIX + b"%d %s" % (len(raw), raw)


def entry_bytes(value: Any) -> bytes:
    """RFC 8785 bytes of an entry-shaped value: ``canonical``, which has a fast path for plain JSON."""
    return canonical(value)


class Signer(Protocol):
    """What sealing an entry needs from a key (``keys.IdentityKey`` is one)."""

    @property
    def key_id(self) -> str: ...

    def sign(self, message: bytes) -> bytes: ...


@dataclass(frozen=True)
class Record:
    """What a caller asks the store to append: a kind, its body, and the payload bytes it names.

    ``blobs`` maps ``sha256_ref(data)`` to ``data``; the body holds the refs, the store keeps the
    bytes in its blob table (erasable: only the refs are signed).
    """

    kind: str
    body: dict[str, Any]
    blobs: Mapping[str, bytes] = field(default_factory=dict[str, bytes])


def check_record(record: Record) -> None:
    """Refuse a record a store must not append (see ``encode_record``)."""
    encode_record(record)


def encode_record(record: Record) -> bytes:
    """The body's canonical bytes, after refusing a record a store must not append: unknown kind,
    non-JSON body, a blob not matching its ref. One encoding pass does both.

    Raises ``StoreError`` (``reason``: ``unknown_kind``, ``bad_body``, ``unreferenced_blob``,
    ``blob_mismatch``): these are bugs in the calling code, not operator input. A lone surrogate in
    a string is found only when the entry is encoded (``seal``), which stores report the same way.
    """
    if record.kind not in KINDS:
        raise StoreError(
            f"cannot append an entry of unknown kind {record.kind!r}",
            remedy="use one of the kinds listed in docs/ledger-format.md",
            reason="unknown_kind",
        )
    if as_dict(record.body) is None:  # typed a dict, but callers build records from data
        raise StoreError(f"the body of a {record.kind} entry must be a JSON object", reason="bad_body")
    try:
        body_bytes = canonical(record.body)
    except CanonicalError as exc:
        raise StoreError(
            f"the body of a {record.kind} entry is not canonical JSON: {exc}",
            remedy="entry bodies hold JSON values only (no NaN, no integers of magnitude 2**53 or more)",
            reason="bad_body",
        ) from exc
    named: dict[str, None] = {}
    if record.blobs:  # the refs the body names, collected in one walk (no generator per level)
        _gather_refs(record.body, named)
    for ref, data in record.blobs.items():
        if ref not in named:
            raise StoreError(
                f"blob {ref[:23]}... of a {record.kind} entry is not named in its body",
                remedy="put the blob's ref in the body; only what the body names is kept",
                reason="unreferenced_blob",
            )
        if not _is_bytes(data) or sha256_ref(bytes(data)) != ref:
            raise StoreError(
                f"blob {ref[:23]}... of a {record.kind} entry does not hash to its ref",
                remedy="key blobs by sha256_ref(data)",
                reason="blob_mismatch",
            )
    return body_bytes


def seal(
    signer: Signer,
    *,
    log: str,
    session: str,
    seq: int,
    index: int,
    ts: int,
    kind: str,
    body: dict[str, Any],
    prev: str,
    body_bytes: bytes | None = None,
) -> StoredEntry:
    """Build the entry, canonicalise, hash and sign it (docs/ledger-format.md, section 2).

    ``body_bytes``, when given, must be ``entry_bytes(body)``: a store encodes bodies in the
    callers' threads and only splices them in here, under its write lock. The members of an entry
    sort as body, index, kind, log, prev, seq, session, ts, v, so the canonical bytes are the
    same concatenation either way (the golden vectors hold the two together).
    """
    entry: dict[str, Any] = {
        "v": ENTRY_VERSION,
        "log": log,
        "session": session,
        "seq": seq,
        "index": index,
        "ts": ts,
        "kind": kind,
        "body": body,
        "prev": prev,
    }
    if body_bytes is None or not (kind.isascii() and log.isascii() and session.isascii() and prev.isalnum()):
        raw = entry_bytes(entry)
    else:
        raw = b"".join(
            (
                b'{"body":',
                body_bytes,
                b',"index":%d,"kind":%s,"log":%s,"prev":"%s","seq":%d,"session":%s,"ts":%d,"v":%d}'
                % (index, _json_string(kind), _json_string(log), prev.encode(), seq, _json_string(session), ts,
                   ENTRY_VERSION),
            )
        )  # fmt: skip
    return StoredEntry(
        entry=entry,
        hash=hashlib.sha256(raw).hexdigest(),
        sig=signer.sign(entry_signing_payload(raw)),
        keyid=signer.key_id,
        raw=raw,
    )


@dataclass(frozen=True)
class StoredEntry:
    """One signed entry as stored and exported.

    ``raw`` is the canonical bytes that were hashed and signed. A store passes the bytes it read;
    when absent they are recomputed from ``entry``. ``hash`` and ``keyid`` are what the holder
    claims: verification recomputes the hash and looks the key id up in a trusted set.
    """

    entry: dict[str, Any]
    hash: str
    sig: bytes
    keyid: str
    raw: bytes = field(default=b"", repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.raw:
            object.__setattr__(self, "raw", entry_bytes(self.entry))

    @classmethod
    def from_raw(cls, raw: bytes, sig: bytes, keyid: str, hash_hex: str | None = None) -> StoredEntry:
        """An entry from stored bytes. Raises ``ValueError`` if ``raw`` is not a JSON object."""
        value = loads(raw)
        if not isinstance(value, dict):
            raise ValueError("an entry is a JSON object")
        entry = cast(dict[str, Any], value)
        return cls(
            entry=entry,
            hash=hash_hex if hash_hex is not None else hashlib.sha256(raw).hexdigest(),
            sig=sig,
            keyid=keyid,
            raw=raw,
        )

    @property
    def session(self) -> str:
        return self.entry["session"]

    @property
    def seq(self) -> int:
        return self.entry["seq"]

    @property
    def index(self) -> int:
        return self.entry["index"]

    @property
    def kind(self) -> str:
        return self.entry["kind"]

    @property
    def body(self) -> dict[str, Any]:
        return self.entry["body"]

    @property
    def ts(self) -> int:
        return self.entry["ts"]

    @property
    def prev(self) -> str:
        return self.entry["prev"]

    @property
    def log(self) -> str:
        return self.entry["log"]

    def refs(self) -> list[str]:
        """The ``sha256:`` refs the body names, in order of first appearance, once each."""
        return refs_in(self.body)

    def to_json(self) -> dict[str, Any]:
        """The portable form: ``{"entry", "hash", "sig" (base64), "keyid"}``."""
        return {
            "entry": self.entry,
            "hash": self.hash,
            "sig": base64.b64encode(self.sig).decode("ascii"),
            "keyid": self.keyid,
        }

    @classmethod
    def from_json(cls, data: Any) -> StoredEntry:
        """Parse the portable form. Raises ``BundleFormatError`` (``reason="malformed_entry"``)."""
        obj = as_dict(data)
        if obj is None:
            raise _malformed("a stored entry is a JSON object with entry, hash, sig and keyid")
        entry, hash_hex, sig, keyid = as_dict(obj.get("entry")), obj.get("hash"), obj.get("sig"), obj.get("keyid")
        if entry is None or not isinstance(hash_hex, str) or not isinstance(keyid, str):
            raise _malformed("a stored entry needs an 'entry' object and 'hash' and 'keyid' strings")
        if not isinstance(sig, str):
            raise _malformed("a stored entry's 'sig' is a base64 string")
        try:
            sig_bytes = base64.b64decode(sig, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _malformed("a stored entry's 'sig' is not valid base64") from exc
        try:
            return cls(entry=entry, hash=hash_hex, sig=sig_bytes, keyid=keyid)
        except CanonicalError as exc:
            raise _malformed(f"a stored entry is not canonical JSON: {exc}") from exc


def _is_bytes(value: object) -> bool:
    return isinstance(value, bytes | bytearray)


def _malformed(message: str) -> BundleFormatError:
    return BundleFormatError(message, reason="malformed_entry")


def iter_refs(value: Any) -> Iterator[str]:
    """Every string in ``value`` (recursively) that is a ``sha256:<64 hex>`` ref."""
    if isinstance(value, str):
        if len(value) == 71 and REF_RE.fullmatch(value):
            yield value
        return
    obj = as_dict(value)
    items: Iterable[Any] | None = obj.values() if obj is not None else as_list(value)
    if items is None:
        return
    for item in items:
        if type(item) is str:  # the common case, without a generator per string
            if len(item) == 71 and REF_RE.fullmatch(item):
                yield item
        elif isinstance(item, dict | list | str):
            yield from iter_refs(item)


def refs_in(value: Any) -> list[str]:
    """What ``iter_refs`` yields, once each in order of first appearance: without a generator per
    object or array, since a verified read walks every entry's body (V11 and its payload fetch)."""
    found: dict[str, None] = {}
    _gather_refs(value, found)
    return list(found)


def _gather_refs(value: Any, found: dict[str, None]) -> None:
    if isinstance(value, str):
        if len(value) == 71 and REF_RE.fullmatch(value):
            found[value] = None
        return
    items: Iterable[Any]
    if isinstance(value, dict):
        items = cast(dict[str, Any], value).values()
    elif isinstance(value, list):
        items = cast(list[Any], value)
    else:
        return
    match = REF_RE.fullmatch
    for item in items:
        if type(item) is str:  # the common case, without a call per string
            if len(item) == 71 and match(item):
                found[item] = None
        elif isinstance(item, dict | list | str):
            _gather_refs(item, found)
