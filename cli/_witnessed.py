"""What ``truss ledger verify|checkpoint`` add for witnesses and key rotations (one place, so the
ledger commands only call it): ``--policy`` and ``--checkpoint`` arguments, the key history of a
store, the policy steps W1-W5 over a home's ledger, a bundle or notes alone, and rendering.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from truss_cli._ctx import Ctx

from truss._errors import BundleFormatError, UsageError
from truss.ledger.audit import store_key_history as store_history
from truss.ledger.audit import stored_checkpoint_signers
from truss.ledger.keyhistory import KeyHistory, KeyPeriod, bundle_key_history, follow_rotations
from truss.ledger.keys import TrustedKeys, VerifierKey
from truss.ledger.merkle import root_at
from truss.ledger.note import MAX_NOTE_BYTES, parse_checkpoint, parse_note
from truss.ledger.stores import LedgerStore

if TYPE_CHECKING:  # the policy language and its checks load only when a policy or note is given
    from truss.ledger.tlog_policy import Policy
    from truss.ledger.witnessed import PolicyReport

__all__ = [
    "add_policy_args",
    "bundle_history",
    "policy_for_bundle",
    "policy_for_notes",
    "policy_for_store",
    "read_notes",
    "read_policy",
    "render_policy_failure",
    "store_history",
    "stored_checkpoint_signers",
]


def add_policy_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy",
        metavar="FILE",
        help="also require witness cosignatures: a C2SP tlog-policy file (witnesses, groups, quorum); "
        "the checkpoint checked must meet its quorum",
    )
    parser.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="NOTE",
        help="a signed (cosigned) checkpoint of this log you hold, checked against the others and the log "
        "(a fork is reported with both); repeatable. Alone, without SESSION or --all, only the notes are checked",
    )


def read_policy(args: argparse.Namespace) -> Policy | None:
    path = getattr(args, "policy", None)
    if not path:
        return None
    from truss.witness.config import read_policy_file

    return read_policy_file(Path(path))


def read_notes(args: argparse.Namespace) -> list[tuple[bytes, str]]:
    out: list[tuple[bytes, str]] = []
    given: list[str] = list(getattr(args, "checkpoint", None) or [])
    for text in given:
        path = Path(text)
        try:
            size = path.stat().st_size
            if size > MAX_NOTE_BYTES:
                raise BundleFormatError(f"{path}: {size} bytes is more than a signed note may hold", file=str(path))
            out.append((path.read_bytes(), str(path)))
        except OSError as exc:
            raise UsageError(f"cannot read the checkpoint {path}: {exc.strerror}", remedy="check the path") from exc
    return out


def _session_head_index(store: LedgerStore, session: str) -> int | None:
    info = store.session(session)
    if info is None or not info.entries:
        return None
    last = next(iter(store.read_session(session, from_seq=int(info.entries) - 1)), None)
    return None if last is None else last.index


def policy_for_store(
    store: LedgerStore, policy: Policy | None, history: KeyHistory, session: str | None, notes: list[tuple[bytes, str]]
) -> PolicyReport:
    """W1-W5 for a home's ledger: the latest checkpoint (or the first covering ``session`` that
    meets the quorum) must meet it; every stored checkpoint and every note is checked for forks."""
    from truss.ledger.tlog_policy import Policy
    from truss.ledger.witnessed import PolicyReport, verify_with_policy

    active = policy or Policy.empty()
    stored = sorted(store.checkpoints(), key=lambda cp: cp.size)
    candidates = stored
    if session is not None:
        head = _session_head_index(store, session)
        candidates = [cp for cp in stored if head is not None and cp.size > head]
    required: list[tuple[bytes, str]] = []
    if policy is not None:
        if not candidates:
            what = f"session {session}'s last entry" if session else "the log"
            return PolicyReport(
                ok=False,
                step="W5",
                reason="not_checkpointed",
                message=f"no signed checkpoint covers {what} yet, so none can be witnessed",
            )
        choice = candidates[-1] if session is None else _first_witnessed(candidates, active, history, store.origin)
        required = [(choice.note.encode("utf-8"), f"the stored checkpoint of size {choice.size}")]
    others = [(cp.note.encode("utf-8"), f"the stored checkpoint of size {cp.size}") for cp in stored]
    size = store.tree_size()
    return verify_with_policy(
        active,
        origin=store.origin,
        keys_for=_keys_for(history),
        required=required,
        others=[*others, *notes],
        tree_size=size,
        root_at=lambda n: root_at(n, store.node),
    )


def _keys_for(history: KeyHistory) -> Callable[[int], Sequence[VerifierKey]]:
    if history.rotations:
        return history.checkpoint_keys
    keys = list(history.trusted)

    def every_key(_size: int) -> Sequence[VerifierKey]:
        return keys

    return every_key


def _first_witnessed(candidates: list[Any], policy: Policy, history: KeyHistory, origin: str) -> Any:
    from truss.ledger.witnessed import verify_with_policy

    for cp in candidates:
        report = verify_with_policy(
            policy,
            origin=origin,
            keys_for=_keys_for(history),
            required=[(cp.note.encode("utf-8"), "candidate")],
        )
        if report.ok:
            return cp
    return candidates[-1]


def bundle_history(data: bytes, trusted: TrustedKeys) -> KeyHistory:
    """The key history a bundle carries, followed from ``trusted`` (after ``verify_bundle`` passed)."""
    doc: Any = json.loads(data)
    statements = bundle_key_history(doc, str(doc.get("origin")))
    return follow_rotations([e for e, _ in statements], trusted, origin=str(doc.get("origin")))


def policy_for_bundle(
    data: bytes, trusted: TrustedKeys, policy: Policy | None, notes: list[tuple[bytes, str]]
) -> PolicyReport:
    """W1-W5 for a verified bundle: its checkpoint must meet the quorum; notes are fork-checked."""
    from truss.ledger.bundle import MAX_BUNDLE_BYTES
    from truss.ledger.tlog_policy import Policy
    from truss.ledger.witnessed import verify_with_policy

    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleFormatError("the bundle is too large")
    doc: Any = json.loads(data)
    history = bundle_history(data, trusted)
    note = str(doc["checkpoint"]).encode("utf-8")
    required = [(note, "the bundle's checkpoint")] if policy is not None else []
    others = [] if policy is not None else [(note, "the bundle's checkpoint")]
    return verify_with_policy(
        policy or Policy.empty(),
        origin=str(doc["origin"]),
        keys_for=_keys_for(history),
        required=required,
        others=[*others, *notes],
    )


def policy_for_notes(trusted: TrustedKeys, policy: Policy | None, notes: list[tuple[bytes, str]]) -> PolicyReport:
    """W1-W3 and W5 for notes alone (no ledger): each must meet the quorum; no two may fork."""
    from truss.ledger.tlog_policy import Policy
    from truss.ledger.witnessed import verify_with_policy

    if not notes:
        raise UsageError("truss ledger verify: give --checkpoint NOTE to check notes on their own")
    try:
        origin = parse_checkpoint(parse_note(notes[0][0]).text).origin
    except BundleFormatError as exc:
        raise BundleFormatError(f"{notes[0][1]}: {exc.message}", reason=exc.fields.get("reason")) from None
    return verify_with_policy(
        policy or Policy.empty(),
        origin=origin,
        keys_for=_keys_for(KeyHistory([KeyPeriod(k, 0, None) for k in trusted])),
        required=notes if policy is not None else [],
        others=[] if policy is not None else notes,
    )


def render_policy_failure(ctx: Ctx, report: PolicyReport, data: dict[str, Any]) -> int:
    data["policy"] = report.to_json()
    lines = [f"NOT VERIFIED at {report.step} ({report.reason}): {report.message}"]
    if report.fork is not None:
        for item in (report.fork.first, report.fork.second):
            if item.checkpoint.note is not None:
                lines.append(f"--- {item.source} (cosigned by {', '.join(sorted(item.cosignatures)) or 'no witness'})")
                lines.append(item.checkpoint.note.decode("utf-8", errors="replace").rstrip("\n"))
    if report.fork_with_log is not None:
        item, root = report.fork_with_log
        if item.checkpoint.note is not None:
            lines.append(f"--- {item.source}")
            lines.append(item.checkpoint.note.decode("utf-8", errors="replace").rstrip("\n"))
        lines.append(f"--- the log as held: root {root.hex()} at size {item.checkpoint.size}")
    ctx.emit(data, "\n".join(lines))
    return report.exit_code
