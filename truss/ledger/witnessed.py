"""Verification with a witness policy, and the key history applied to checkpoints.

``verify_with_policy`` runs the witness steps of docs/ledger-format.md (section 12) over the
checkpoints a verification has in hand: the one that must meet the quorum (``required``: the
log's latest, the one covering a session, a bundle's) and every other signed checkpoint of the
same log it can see (the store's, the notes an auditor passes with ``--checkpoint``):

  W1 each note is a checkpoint of this log signed by a key allowed to sign at its size
     (``checkpoint_keys`` of the key history; its own reasons, or ``retired_key``);
  W2 each cosignature by a witness of the policy on it verifies (``bad_cosignature``);
  W3 no two of them have the same size and different roots (``fork``: both are shown);
  W4 with the log's tree at hand, none of them disagrees with it: a note at a size the log holds
     has the root the log has there (``fork``), and none is larger than the log (``beyond_log``);
  W5 the required checkpoint has cosignatures meeting the quorum (``quorum_short``, naming each
     short group and its missing witnesses).

A fork is reported before a quorum: two signed histories is the graver finding. The report is
a value; nothing here raises for bad input. ``check_checkpoint_signers`` is W1 alone, for a
verification without a policy.

Sans-IO: the tree is reached through ``root_at`` (a store's nodes or a rebuilt tree).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from truss._errors import InputError, VerificationError
from truss.ledger.cosignature import checkpoint_of
from truss.ledger.keys import VerifierKey
from truss.ledger.note import open_checkpoint
from truss.ledger.tlog_policy import Fork, Policy, Shortfall, Witnessed, find_fork, verify_witnessed

__all__ = ["PolicyReport", "check_checkpoint_signers", "verify_with_policy"]

KeysFor = Callable[[int], Sequence[VerifierKey]]
"""The log keys allowed to sign a checkpoint of a given size (``KeyHistory.checkpoint_keys``)."""


@dataclass(frozen=True)
class PolicyReport:
    """The outcome of W1-W5: ``ok``, or the first failing step's ``step``, ``reason`` and text."""

    ok: bool
    step: str | None = None
    reason: str | None = None
    message: str | None = None
    required: Witnessed | None = None
    short: tuple[Shortfall, ...] = ()
    fork: Fork | None = None
    fork_with_log: tuple[Witnessed, bytes] | None = None
    checked: tuple[Witnessed, ...] = field(default=())

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok}
        if self.required is not None:
            out["checkpoint"] = _witnessed_json(self.required)
        out["checked"] = [_witnessed_json(w) for w in self.checked]
        if not self.ok:
            out.update(step=self.step, reason=self.reason, message=self.message)
        if self.short:
            out["short"] = [
                {"group": s.name, "have": s.have, "need": s.need, "missing": list(s.missing)} for s in self.short
            ]
        if self.fork is not None:
            out["fork"] = [_witnessed_json(self.fork.first, note=True), _witnessed_json(self.fork.second, note=True)]
        if self.fork_with_log is not None:
            note, root = self.fork_with_log
            out["fork"] = [_witnessed_json(note, note=True), {"source": "the log as held", "root": root.hex()}]
        return out


def _witnessed_json(item: Witnessed, *, note: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "source": item.source,
        "size": item.checkpoint.size,
        "root": item.checkpoint.root.hex(),
        "cosigned_by": sorted(item.cosignatures),
        "quorum": item.quorum.ok,
    }
    if note and item.checkpoint.note is not None:
        out["note"] = item.checkpoint.note.decode("utf-8", errors="replace")
    return out


def _open(note: bytes, source: str, policy: Policy, keys_for: KeysFor, origin: str) -> Witnessed:
    size = checkpoint_of(note).size  # form only: which keys may have signed it depends on its size
    return verify_witnessed(note, policy, keys_for(size), origin=origin, source=source)


def verify_with_policy(
    policy: Policy,
    *,
    origin: str,
    keys_for: KeysFor,
    required: Sequence[tuple[bytes, str]],
    others: Sequence[tuple[bytes, str]] = (),
    tree_size: int | None = None,
    root_at: Callable[[int], bytes] | None = None,
) -> PolicyReport:
    """W1-W5 over ``required`` and ``others``, each ``(note, source)`` (see the module docstring).

    Every note in ``required`` must meet the quorum; ``others`` are only checked for W1-W4.
    """
    opened: list[Witnessed] = []
    items = [*required, *others]
    for note, source in items:  # W1, W2
        try:
            opened.append(_open(note, source, policy, keys_for, origin))
        except (VerificationError, InputError) as exc:
            step = "W2" if exc.fields.get("reason") == "bad_cosignature" else "W1"
            reason = str(exc.fields.get("reason") or exc.kind)
            return PolicyReport(ok=False, step=step, reason=reason, message=f"{source}: {exc.message}")
    fork = find_fork(opened)  # W3
    if fork is not None:
        message = fork.describe()
        return PolicyReport(ok=False, step="W3", reason="fork", message=message, fork=fork, checked=tuple(opened))
    if tree_size is not None and root_at is not None:  # W4
        for item in opened:
            size = item.checkpoint.size
            if size > tree_size:
                return PolicyReport(
                    ok=False,
                    step="W4",
                    reason="beyond_log",
                    message=f"{item.source}: a signed checkpoint of size {size}, but the log holds {tree_size} "
                    "entries: it was truncated, or the checkpoint belongs to another history of it",
                    checked=tuple(opened),
                )
            root = root_at(size)
            if root != item.checkpoint.root:
                return PolicyReport(
                    ok=False,
                    step="W4",
                    reason="fork",
                    message=f"{item.describe()} has root {item.checkpoint.root.hex()[:16]}..., but the log as held "
                    f"has root {root.hex()[:16]}... at that size: two histories were signed",
                    fork_with_log=(item, root),
                    checked=tuple(opened),
                )
    for item in opened[: len(required)]:  # W5
        if not item.quorum.ok:
            return PolicyReport(
                ok=False,
                step="W5",
                reason="quorum_short",
                message=f"{item.source}: the checkpoint of size {item.checkpoint.size} is not witnessed to the "
                f"quorum of {policy.source or 'the policy'}: {item.quorum.describe()}",
                required=item,
                short=item.quorum.short,
                checked=tuple(opened),
            )
    return PolicyReport(ok=True, required=opened[0] if required else None, checked=tuple(opened))


def check_checkpoint_signers(
    notes: Sequence[tuple[bytes, str]], keys_for: KeysFor, origin: str
) -> tuple[str, str] | None:
    """W1 without a policy: each note is signed by a key allowed at its size; the first finding."""
    for note, source in notes:
        try:
            size = checkpoint_of(note).size
            open_checkpoint(note, list(keys_for(size)), origin=origin)
        except (VerificationError, InputError) as exc:
            reason = str(exc.fields.get("reason") or exc.kind)
            if reason == "no_trusted_signature":
                reason = "retired_key"
            return reason, f"{source}: {exc.message} (no key of the log's history signs at this size)"
    return None
