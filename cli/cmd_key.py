"""``truss key show|rotate``: the identity key that signs this home's ledger, and its rotations.

``show`` prints the verifier key; ``show --history`` the keys the log has been signed with, each
with the log indexes it signs, followed from the first key through the rotation statements in the
log (docs/ledger-format.md, section 2.3). ``rotate`` makes a new identity key and records the
rotation statement (``truss.keyring``).
"""

from __future__ import annotations

import argparse
from typing import Any

from truss_cli._ctx import Ctx, table

from truss._errors import NotFoundError
from truss.keyring import rotate_identity_key, trust_root
from truss.ledger.keyhistory import LOG_SESSION, KeyHistory, follow_rotations
from truss.ledger.keys import IdentityKey, TrustedKeys, VerifierKey
from truss.ledger.stores import LedgerStore, open_store


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "key",
        help="the identity key that signs this home's ledger",
        description="Inspect or rotate the identity key ($TRUSS_HOME/identity.key, or --key).",
    )
    keys = p.add_subparsers(dest="key_command", metavar="ACTION")
    show = keys.add_parser(
        "show",
        help="print the verifier key, to give auditors as --trusted-key",
        description="Print the verifier key in the C2SP form <name>+<hex key id>+<base64 key>. "
        "It is public: share it with whoever verifies this home's ledgers and bundles. With --history, "
        "print every key the log was signed with and the log indexes each signs, followed from the "
        "first key through the signed rotation statements in the log.",
    )
    show.add_argument(
        "--history", action="store_true", help="the key history: every key, from which log index it signs"
    )
    show.add_argument(
        "--trusted-key",
        action="append",
        default=[],
        metavar="VKEY",
        help="with --history: follow the rotations from this key (default: this home's first key)",
    )
    show.set_defaults(handler=show_key)
    rotate = keys.add_parser(
        "rotate",
        help="make a new identity key and record the rotation in the log",
        description="Make a new identity key with the same name (the log's origin stays the same) and "
        "append a rotation statement to the log: the old key signs the new verifier key and the log "
        "index from which it signs, the new key signs its consent. The old key is retired: the ledger "
        "refuses to sign with it from then on. Verifiers that trust the first key follow the rotation; "
        "give witnesses the new verifier key. Running it again completes a rotation that was interrupted.",
    )
    rotate.set_defaults(handler=rotate_key)


def _history(ctx: Ctx, start: list[VerifierKey]) -> KeyHistory:
    trusted = TrustedKeys(start)
    try:
        runtime = ctx.open_runtime(signing=False)
    except NotFoundError:  # no ledger yet: the key has no rotations
        return follow_rotations((), trusted, origin=start[0].name)
    with runtime:
        store = runtime.store
        entries = list(store.read_session(LOG_SESSION)) if store.session(LOG_SESSION) is not None else []
        return follow_rotations(entries, trusted, origin=store.origin)


def show_key(args: argparse.Namespace, ctx: Ctx) -> int:
    key = IdentityKey.load(ctx.key)
    if not args.history:
        ctx.emit(
            {"name": key.name, "key_id": key.key_id, "vkey": key.verifier.vkey, "file": str(ctx.key)},
            key.verifier.vkey,
        )
        return 0
    start = [VerifierKey.parse(text) for text in args.trusted_key] if args.trusted_key else trust_root(ctx.key)
    history = _history(ctx, start)
    rows: list[list[str]] = []
    for period in history.periods:
        until = "" if period.until_index is None else str(period.until_index - 1)
        how = "trusted start" if period.statement is None else f"rotation at log index {period.statement.index}"
        mark = "  (current)" if period.key == key.verifier else ""
        rows.append([period.key.key_id, str(period.from_index), until or "...", how + mark])
    human = (
        table(rows, ["KEY ID", "FROM INDEX", "TO INDEX", "INTRODUCED BY"])
        + "\n"
        + "\n".join(f"{p.key.key_id}  {p.key.vkey}" for p in history.periods)
    )
    ctx.emit(
        {"name": key.name, "current": key.verifier.vkey, "periods": history.to_json()},
        human,
    )
    return 0


def rotate_key(args: argparse.Namespace, ctx: Ctx) -> int:
    def opener(key: IdentityKey | None) -> LedgerStore:
        # The rotation opens the ledger with the old key, then read-only: keys loaded here, not from --key.
        return open_store(ctx.db, key=key, clock=ctx.clock, create=False)

    result = rotate_identity_key(ctx.key, opener)
    word = "completed an interrupted rotation" if result.completed_earlier else "rotated the identity key"
    ctx.emit(
        result.to_json(),
        f"{word}: {result.old.key_id} -> {result.new.key_id}, signing from log index {result.from_index}\n"
        f"new verifier key: {result.new.vkey}\n"
        "auditors keep trusting the first key (they follow the rotation); give witnesses the new key",
    )
    return 0
