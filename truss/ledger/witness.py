"""The C2SP tlog-witness ``add-checkpoint`` protocol, sans-IO: request and response bytes, and the
witness's decision.

Request body (``format_add_checkpoint`` / ``parse_add_checkpoint``)::

    old <size the client believes the witness last cosigned>\\n
    <base64 consistency-proof hash>\\n            (0 to 63 lines)
    \\n
    <the signed checkpoint note>

Responses: 200 with one or more cosignature lines; 409 with the witness's latest cosigned size
(``text/x.tlog.size``, ``"<size>\\n"``): an old size that is not it, or that size again with another
root (a fork, as the spec asks); 404 unknown log; 403 no trusted log signature (or a trusted one
that fails); 400 a malformed request or an old size above the checkpoint's; 422 a consistency
proof that does not verify. ``interpret`` turns a
response into an ``Outcome`` for the client; ``check_submission`` and ``judge`` are the witness's
two halves: what can be checked without its state (400, 404, 403), and what needs the last
cosigned checkpoint of that log (409, 422). The witness runs ``judge`` and the
update of its state in one transaction, so two concurrent submissions can never both be
cosigned on diverging trees.

What it does not do: HTTP (``truss.witness.client`` and ``truss.witness.server``), state storage,
clocks (the timestamp is an argument of ``cosign``), or choosing witnesses (``tlog_policy``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from truss._errors import BundleFormatError, VerificationError
from truss.ledger.keys import VerifierKey
from truss.ledger.merkle import EMPTY_ROOT, HASH_SIZE, verify_consistency
from truss.ledger.note import MAX_NOTE_BYTES, Checkpoint, NoteSignature, open_checkpoint, parse_checkpoint, parse_note

__all__ = [
    "MAX_PROOF_LINES",
    "MAX_REQUEST_BYTES",
    "MAX_RESPONSE_BYTES",
    "SIZE_CONTENT_TYPE",
    "AddCheckpoint",
    "Judgement",
    "LogState",
    "Outcome",
    "Refusal",
    "Submission",
    "check_submission",
    "format_add_checkpoint",
    "format_size",
    "interpret",
    "judge",
    "parse_add_checkpoint",
    "parse_signature_lines",
]

MAX_PROOF_LINES = 63
MAX_REQUEST_BYTES = MAX_NOTE_BYTES + 64 * (MAX_PROOF_LINES + 1) + 32
MAX_RESPONSE_BYTES = 64 * 1024
SIZE_CONTENT_TYPE = "text/x.tlog.size"
_MAX_SIZE = 2**63 - 1


@dataclass(frozen=True)
class AddCheckpoint:
    """An ``add-checkpoint`` request: the old size, the consistency proof, the signed checkpoint."""

    old_size: int
    proof: tuple[bytes, ...]
    checkpoint: bytes


def format_add_checkpoint(request: AddCheckpoint) -> bytes:
    lines = [f"old {request.old_size}"]
    lines.extend(base64.b64encode(h).decode("ascii") for h in request.proof)
    return ("\n".join(lines) + "\n\n").encode("ascii") + request.checkpoint


def format_size(size: int) -> bytes:
    """The body of a 409 answer."""
    return f"{size}\n".encode("ascii")


class Refusal(Exception):
    """A witness's refusal: the HTTP ``status``, a stable ``reason`` and a one-line ``message``."""

    def __init__(self, status: int, reason: str, message: str, *, evidence: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.evidence = evidence


def _decimal(text: str, what: str) -> int:
    if not text.isascii() or not text.isdigit() or (text != "0" and text.startswith("0")) or len(text) > 19:
        raise Refusal(400, "bad_request", f"{what} is not a decimal number without leading zeros")
    value = int(text)
    if value > _MAX_SIZE:
        raise Refusal(400, "bad_request", f"{what} is out of range")
    return value


def parse_add_checkpoint(body: bytes) -> AddCheckpoint:
    """Parse a request body; raises ``Refusal`` (400) for anything malformed."""
    if len(body) > MAX_REQUEST_BYTES:
        raise Refusal(400, "too_large", f"an add-checkpoint request is at most {MAX_REQUEST_BYTES} bytes")
    head, sep, note = body.partition(b"\n\n")
    if not sep or not note:
        raise Refusal(400, "bad_request", "the request has an old line, proof lines, a blank line and a checkpoint")
    try:
        lines = head.decode("ascii").split("\n")
    except UnicodeDecodeError:
        raise Refusal(400, "bad_request", "the request's header lines are ASCII") from None
    if not lines[0].startswith("old "):
        raise Refusal(400, "bad_request", "the request starts with an 'old <size>' line")
    old = _decimal(lines[0][4:], "the old size")
    if len(lines) - 1 > MAX_PROOF_LINES:
        raise Refusal(400, "bad_request", f"a request carries at most {MAX_PROOF_LINES} proof lines")
    proof: list[bytes] = []
    for line in lines[1:]:
        try:
            raw = base64.b64decode(line.encode("ascii"), validate=True)
        except (binascii.Error, ValueError):
            raise Refusal(400, "bad_request", "a proof line is not base64") from None
        if len(raw) != HASH_SIZE or base64.b64encode(raw).decode("ascii") != line:
            raise Refusal(400, "bad_request", "a proof line is the base64 of a 32-byte hash")
        proof.append(raw)
    return AddCheckpoint(old_size=old, proof=tuple(proof), checkpoint=note)


# -- the witness ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogState:
    """What a witness keeps per log: the latest checkpoint it cosigned (size, root, the note)."""

    size: int
    root: bytes
    note: bytes = b""


@dataclass(frozen=True)
class Submission:
    """A request that passed the state-free checks: its parsed parts and the opened checkpoint.

    ``log_signatures`` are the note's lines by keys the witness trusts for the log (each verified);
    the lines it ignored, by keys it does not know, are not among them and are not worth keeping.
    """

    request: AddCheckpoint
    checkpoint: Checkpoint
    log_signatures: tuple[NoteSignature, ...] = ()


def check_submission(body: bytes, logs: Mapping[str, Sequence[VerifierKey]]) -> Submission:
    """Parse and check what needs no state: form (400), origin (404), the log's signature (403),
    and the old size not above the checkpoint's (400).

    ``logs`` maps each followed origin to the verifier keys trusted for it.
    """
    request = parse_add_checkpoint(body)
    try:
        note = parse_note(request.checkpoint)
        body_text = parse_checkpoint(note.text)
    except BundleFormatError as exc:
        raise Refusal(400, "bad_request", f"the checkpoint cannot be parsed: {exc.message}") from None
    keys = logs.get(body_text.origin)
    if keys is None:
        raise Refusal(404, "unknown_log", f"this witness does not follow the log {body_text.origin!r}")
    try:
        checkpoint = open_checkpoint(request.checkpoint, list(keys), origin=body_text.origin, allow_extensions=True)
    except VerificationError as exc:
        message = f"the checkpoint is not signed by a key of that log ({exc.message})"
        raise Refusal(403, "bad_signature", message) from None
    except BundleFormatError as exc:
        raise Refusal(400, "bad_request", f"the checkpoint cannot be parsed: {exc.message}") from None
    if request.old_size > checkpoint.size:
        message = f"old size {request.old_size} is above the checkpoint's {checkpoint.size}"
        raise Refusal(400, "old_beyond_size", message)
    known = {(key.name, key.key_id) for key in keys}
    verified = tuple(dict.fromkeys(sig for sig in note.signatures if (sig.name, sig.key_id.hex()) in known))
    return Submission(request=request, checkpoint=checkpoint, log_signatures=verified)


@dataclass(frozen=True)
class Judgement:
    """The stateful verdict on a submission: cosign it (``ok``), or refuse it with ``refusal``.

    ``conflict_size`` is the witness's latest size for a 409.
    """

    ok: bool
    refusal: Refusal | None = None
    conflict_size: int | None = None


def judge(submission: Submission, state: LogState | None) -> Judgement:
    """Check the submission against the last cosigned checkpoint of its log (``None``: never cosigned).

    422 (kept as evidence of misbehaviour: validly signed, yet inconsistent) for an empty tree
    with another root than the empty one; 409 when the old size is not the witness's latest; 422
    (evidence too) when the proof does not verify or when a proof is given from size 0; 409 with
    the latest size (evidence too) when that same size comes with another root (tlog-witness).
    """
    request, checkpoint = submission.request, submission.checkpoint
    if checkpoint.size == 0 and checkpoint.root != EMPTY_ROOT:
        refusal = Refusal(422, "bad_empty_root", "a checkpoint of size 0 has the root of the empty tree", evidence=True)
        return Judgement(ok=False, refusal=refusal)
    latest = 0 if state is None else state.size
    if request.old_size != latest:
        return Judgement(
            ok=False,
            refusal=Refusal(409, "conflict", f"the latest cosigned size is {latest}, not {request.old_size}"),
            conflict_size=latest,
        )
    if latest == 0:
        if request.proof:
            refusal = Refusal(422, "bad_proof", "a proof from size 0 must be empty", evidence=True)
            return Judgement(ok=False, refusal=refusal)
        return Judgement(ok=True)
    assert state is not None
    if checkpoint.size == state.size:
        if checkpoint.root != state.root:
            return Judgement(
                ok=False,
                refusal=Refusal(
                    409,
                    "fork",
                    f"a checkpoint of size {state.size} with another root than the one cosigned before: a fork",
                    evidence=True,
                ),
                conflict_size=state.size,
            )
        if request.proof:
            return Judgement(ok=False, refusal=Refusal(422, "bad_proof", "a proof between equal sizes is empty"))
        return Judgement(ok=True)
    if not verify_consistency(state.size, checkpoint.size, state.root, checkpoint.root, request.proof):
        return Judgement(
            ok=False,
            refusal=Refusal(
                422,
                "bad_proof",
                f"the consistency proof from size {state.size} to {checkpoint.size} does not verify",
                evidence=True,
            ),
        )
    return Judgement(ok=True)


# -- the client's view of an answer -----------------------------------------------------------------

OutcomeKind = Literal[
    "cosigned", "conflict", "unknown_log", "forbidden", "bad_request", "bad_proof", "retry", "bad_response"
]


@dataclass(frozen=True)
class Outcome:
    """What a witness's answer means to the client.

    ``cosigned``: ``lines`` are the returned signature lines (not yet verified); ``conflict``: the
    witness's latest ``size`` (prove again from there); ``retry``: a transient failure (429, 5xx);
    the others are refusals named after the status (404, 403, 400, 422) or an answer that does not
    follow the protocol.
    """

    kind: OutcomeKind
    status: int
    size: int | None = None
    lines: tuple[NoteSignature, ...] = ()
    detail: str = ""


def parse_signature_lines(body: bytes) -> tuple[NoteSignature, ...]:
    """The note signature lines of a 200 answer; raises ``BundleFormatError`` for anything else."""
    if len(body) > MAX_RESPONSE_BYTES:
        raise BundleFormatError(f"a witness's answer is at most {MAX_RESPONSE_BYTES} bytes", reason="too_large")
    # A note with a placeholder text: the signature-line grammar is the note's own.
    return parse_note(b"x\n\n" + body).signatures


def interpret(status: int, content_type: str, body: bytes) -> Outcome:
    """Map an HTTP answer to an ``Outcome``; never raises."""
    if status == 200:
        try:
            lines = parse_signature_lines(body)
        except BundleFormatError as exc:
            return Outcome("bad_response", status, detail=f"the cosignature lines cannot be parsed: {exc.message}")
        return Outcome("cosigned", status, lines=lines)
    if status == 409:
        kind = content_type.split(";", 1)[0].strip().lower()
        text = body[:32].decode("ascii", errors="replace")
        if kind != SIZE_CONTENT_TYPE or not text.endswith("\n"):
            return Outcome("bad_response", status, detail=f"a 409 answer is a {SIZE_CONTENT_TYPE} size line")
        try:
            size = _decimal(text[:-1], "the witness's size")
        except Refusal:
            return Outcome("bad_response", status, detail="a 409 answer's size is not a decimal number")
        return Outcome("conflict", status, size=size)
    refusals: dict[int, OutcomeKind] = {404: "unknown_log", 403: "forbidden", 400: "bad_request", 422: "bad_proof"}
    if status in refusals:
        return Outcome(refusals[status], status)
    if status in (408, 429) or status >= 500:
        return Outcome("retry", status)
    return Outcome("bad_response", status, detail=f"HTTP {status} is not an answer of the witness protocol")
