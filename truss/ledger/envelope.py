"""DSSE envelopes, and the in-toto Statement v1 that carries a session's verdict.

An envelope is ``{"payloadType", "payload": base64, "signatures": [{"keyid", "sig": base64}]}``;
each signature is Ed25519 over the DSSE v1 pre-authentication encoding ``pae(payloadType,
payload)`` (the one implementation lives in ``entry``), so an envelope signature can never pass
for a ledger entry's signature or a checkpoint's, and vice versa.

Verification (``verify_envelope``): signatures whose key id the caller does not trust are
ignored; a trusted key id whose signature fails rejects the envelope; at least one trusted
signature must verify. The verdict statement is::

    {"_type": "https://in-toto.io/Statement/v1",
     "subject": [{"name": "truss-session:<id>", "digest": {"sha256": "<head entry hash hex>"}}],
     "predicateType": "https://truss.dev/verdict/v1",
     "predicate": {"status", "checks", "contract_hash", "head", "checkpoint"}}

where ``head`` is the hash of the session's last entry and ``checkpoint`` the signed checkpoint
note (text) that covers it. Sans-IO; what it does not do: decide the verdict (``truss.verdict``),
store envelopes (the store keeps them beside the chain), or choose which keys to trust.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from truss._errors import BundleFormatError, VerificationError
from truss._json import as_dict, as_list
from truss.ledger.canonical import canonical
from truss.ledger.entry import pae

__all__ = [
    "IN_TOTO_PAYLOAD_TYPE",
    "MAX_ENVELOPE_BYTES",
    "STATEMENT_TYPE",
    "VERDICT_PREDICATE_TYPE",
    "Envelope",
    "EnvelopeSigner",
    "EnvelopeTrust",
    "VerdictStatement",
    "open_verdict",
    "parse_envelope",
    "sign_envelope",
    "sign_verdict",
    "verdict_statement",
    "verify_envelope",
]

IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
VERDICT_PREDICATE_TYPE = "https://truss.dev/verdict/v1"
SUBJECT_PREFIX = "truss-session:"
MAX_ENVELOPE_BYTES = 4 * 1024 * 1024
_MAX_SIGNATURES = 16
_HEX64 = re.compile(r"[0-9a-f]{64}")
VERDICT_STATUSES = frozenset({"pass", "fail", "error"})


class EnvelopeSigner(Protocol):
    """A key that signs (``keys.IdentityKey`` is one): hex ``key_id`` and ``sign``."""

    @property
    def key_id(self) -> str: ...

    def sign(self, message: bytes) -> bytes: ...


class EnvelopeTrust(Protocol):
    """The trusted key set (``keys.TrustedKeys`` is one)."""

    def __contains__(self, key_id: object) -> bool: ...

    def verify(self, key_id: str, message: bytes, signature: bytes) -> bool: ...


@dataclass(frozen=True)
class Envelope:
    """A parsed DSSE envelope: the payload bytes and ``(keyid, sig)`` pairs."""

    payload_type: str
    payload: bytes
    signatures: tuple[tuple[str, bytes], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "payloadType": self.payload_type,
            "payload": base64.b64encode(self.payload).decode("ascii"),
            "signatures": [{"keyid": k, "sig": base64.b64encode(s).decode("ascii")} for k, s in self.signatures],
        }

    def to_bytes(self) -> bytes:
        """Canonical JSON bytes, the form stored beside the chain and put in bundles."""
        return canonical(self.to_json())


def sign_envelope(payload: bytes, payload_type: str, signers: Sequence[EnvelopeSigner]) -> Envelope:
    """An envelope of ``payload`` signed by each of ``signers`` over ``pae(payload_type, payload)``."""
    if not signers:
        raise ValueError("an envelope needs at least one signer")
    message = pae(payload_type, payload)
    return Envelope(payload_type, payload, tuple((s.key_id, s.sign(message)) for s in signers))


def parse_envelope(data: bytes | Mapping[str, Any]) -> Envelope:
    """Parse an envelope from its JSON bytes or a decoded object; checks form, not signatures."""
    if isinstance(data, bytes | bytearray):
        if len(data) > MAX_ENVELOPE_BYTES:
            raise _bad(f"an envelope is at most {MAX_ENVELOPE_BYTES} bytes, this one is {len(data)}")
        try:
            value: Any = json.loads(data)
        except (ValueError, RecursionError):
            raise _bad("an envelope is a JSON object") from None
    else:
        value = data
    obj = as_dict(value)
    if obj is None:
        raise _bad("an envelope is a JSON object")
    # DSSE: consumers MUST ignore unrecognized fields (of the envelope and of each signature).
    payload_type, payload, signatures = obj.get("payloadType"), obj.get("payload"), obj.get("signatures")
    if not isinstance(payload_type, str) or not payload_type:
        raise _bad("an envelope's payloadType is a non-empty string")
    if not isinstance(payload, str):
        raise _bad("an envelope's payload is a base64 string")
    items = as_list(signatures)
    if items is None or not items or len(items) > _MAX_SIGNATURES:
        raise _bad(f"an envelope carries 1 to {_MAX_SIGNATURES} signatures")
    pairs: list[tuple[str, bytes]] = []
    for item in items:
        sig_obj = as_dict(item)
        if sig_obj is None:
            raise _bad("each envelope signature is an object with keyid and sig")
        keyid, sig = sig_obj.get("keyid", ""), sig_obj.get("sig")
        if not isinstance(keyid, str) or not isinstance(sig, str):
            raise _bad("each envelope signature has a string keyid and a base64 sig")
        pairs.append((keyid, _b64(sig)))
    return Envelope(payload_type, _b64(payload), tuple(pairs))


def verify_envelope(
    data: bytes | Mapping[str, Any] | Envelope, trusted: EnvelopeTrust, *, payload_type: str | None = None
) -> bytes:
    """The payload of an envelope that verifies against ``trusted``; raises otherwise.

    Raises ``BundleFormatError`` for an unparseable envelope and ``VerificationError``
    (``reason``: ``payload_type_mismatch``, ``bad_signature``, ``no_trusted_signature``).
    """
    env = data if isinstance(data, Envelope) else parse_envelope(data)
    if payload_type is not None and env.payload_type != payload_type:
        raise VerificationError(
            f"envelope payload type is {env.payload_type!r}, expected {payload_type!r}",
            remedy="this envelope signs something else; use the envelope Truss issued for the verdict",
            reason="payload_type_mismatch",
        )
    message = pae(env.payload_type, env.payload)
    verified = 0
    for keyid, sig in env.signatures:
        if keyid not in trusted:
            continue
        if not trusted.verify(keyid, message, sig):
            raise VerificationError(
                f"the envelope's signature by trusted key {keyid} does not verify",
                remedy="the envelope or its payload was altered; do not trust it",
                reason="bad_signature",
                key_id=keyid,
            )
        verified += 1
    if not verified:
        raise VerificationError(
            "no signature on the envelope is by a trusted key",
            remedy="pass the log's verifier key with --trusted-key",
            reason="no_trusted_signature",
            key_ids=[k for k, _ in env.signatures],
        )
    return env.payload


# -- the verdict statement ---------------------------------------------------------------------


@dataclass(frozen=True)
class VerdictStatement:
    """A verified verdict: the session, its head hash, and the predicate fields."""

    session: str
    head: str
    status: str
    checks: list[Any]
    contract_hash: str
    checkpoint: str | None
    statement: dict[str, Any]


def verdict_statement(
    *, session: str, head: str, status: str, checks: Sequence[Any], contract_hash: str, checkpoint: str | None
) -> dict[str, Any]:
    """The in-toto Statement v1 of a session's verdict (``head``: hex hash of its last entry)."""
    if not _HEX64.fullmatch(head):
        raise ValueError("a head is the 64 hex digits of an entry hash")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": SUBJECT_PREFIX + session, "digest": {"sha256": head}}],
        "predicateType": VERDICT_PREDICATE_TYPE,
        "predicate": {
            "status": status,
            "checks": list(checks),
            "contract_hash": contract_hash,
            "head": head,
            "checkpoint": checkpoint,
        },
    }


def sign_verdict(statement: Mapping[str, Any], signer: EnvelopeSigner) -> Envelope:
    """The DSSE envelope (payload type ``application/vnd.in-toto+json``) of a verdict statement."""
    return sign_envelope(canonical(dict(statement)), IN_TOTO_PAYLOAD_TYPE, [signer])


def open_verdict(
    data: bytes | Mapping[str, Any] | Envelope,
    trusted: EnvelopeTrust,
    *,
    session: str | None = None,
    head: str | None = None,
) -> VerdictStatement:
    """Verify a verdict envelope and its statement's shape; optionally pin the session and head.

    ``VerificationError`` reasons beyond ``verify_envelope``'s: ``bad_statement`` (not a Truss
    verdict statement), ``verdict_session_mismatch``, ``verdict_head_mismatch`` (the envelope
    speaks of another session or another head: a verdict moved from elsewhere).
    """
    payload = verify_envelope(data, trusted, payload_type=IN_TOTO_PAYLOAD_TYPE)
    try:
        value: Any = json.loads(payload)
    except (ValueError, RecursionError):
        raise _bad_statement("the verdict payload is not JSON") from None
    st = as_dict(value)
    if st is None:
        raise _bad_statement("the verdict payload is not a JSON object")
    if st.get("_type") != STATEMENT_TYPE or st.get("predicateType") != VERDICT_PREDICATE_TYPE:
        raise _bad_statement("the payload is not an in-toto Statement v1 with the Truss verdict predicate")
    subjects, pred = as_list(st.get("subject")), as_dict(st.get("predicate"))
    if subjects is None or len(subjects) != 1 or pred is None:
        raise _bad_statement("a verdict statement has exactly one subject and a predicate object")
    subject: Any = subjects[0]
    name: Any = _member(subject, "name")
    sha: Any = _member(_member(subject, "digest"), "sha256")
    if not isinstance(name, str) or not name.startswith(SUBJECT_PREFIX) or not isinstance(sha, str):
        raise _bad_statement("the verdict subject is truss-session:<id> with a sha256 digest")
    subject_session = name[len(SUBJECT_PREFIX) :]
    status, checks = pred.get("status"), as_list(pred.get("checks"))
    contract_hash, pred_head, checkpoint = pred.get("contract_hash"), pred.get("head"), pred.get("checkpoint")
    if (
        status not in VERDICT_STATUSES
        or checks is None
        or not isinstance(contract_hash, str)
        or not isinstance(pred_head, str)
        or not (checkpoint is None or isinstance(checkpoint, str))
    ):
        raise _bad_statement("the verdict predicate needs status, checks, contract_hash, head and checkpoint")
    if not _HEX64.fullmatch(sha) or pred_head != sha:
        raise VerificationError(
            "the verdict's subject digest and predicate head differ",
            remedy="the statement is inconsistent; do not trust it",
            reason="verdict_head_mismatch",
            session=subject_session,
        )
    if session is not None and subject_session != session:
        raise VerificationError(
            f"the verdict is about session {subject_session}, not {session}",
            remedy="use the verdict envelope of this session",
            reason="verdict_session_mismatch",
            session=session,
        )
    if head is not None and sha != head:
        raise VerificationError(
            f"the verdict of session {subject_session} names head {sha[:12]}…, but the session's head is {head[:12]}…",
            remedy="the verdict was issued for a different record of this session; do not trust it",
            reason="verdict_head_mismatch",
            session=subject_session,
        )
    return VerdictStatement(
        session=subject_session,
        head=sha,
        status=str(status),
        checks=list(checks),
        contract_hash=contract_hash,
        checkpoint=checkpoint,
        statement=st,
    )


def _member(value: Any, key: str | int) -> Any:
    """``value[key]`` when ``value`` is an object with that key or a list with that index, else None."""
    obj, items = as_dict(value), as_list(value)
    if obj is not None and isinstance(key, str):
        return obj.get(key)
    if items is not None and isinstance(key, int):
        return items[key] if 0 <= key < len(items) else None
    return None


def _b64(text: str) -> bytes:
    # DSSE allows standard or URL-safe base64; Truss writes standard.
    try:
        raw = text.encode("ascii")
        if b"-" in raw or b"_" in raw:
            raw = raw.replace(b"-", b"+").replace(b"_", b"/")
        return base64.b64decode(raw + b"=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise _bad("envelope fields are base64 (standard or URL-safe)") from None


def _bad(message: str) -> BundleFormatError:
    return BundleFormatError(message, remedy="obtain the envelope again from its source", reason="bad_envelope")


def _bad_statement(message: str) -> VerificationError:
    return VerificationError(message, remedy="this is not a Truss verdict; do not trust it", reason="bad_statement")
