"""``truss ledger keys list|add-worker|remove-worker`` and ``truss ledger checkpoint --every``.

The log's key set lives in the ledger (docs/postgresql.md, "Many workers, many keys"): the log key
admits a worker's own identity key with a signed ``key_admitted`` statement in ``@log`` (the
worker's consent, printed by ``truss init --join``, goes in it) and removes one with
``key_removed``. Checkpoints are signed by the log key only, so a home holding it runs the
publisher (``ledger checkpoint --every DURATION``) that workers' session ends wait for.

Thin: open the runtime, check this home's key is a log key of the ledger, append, render. Exit 0
done (also when nothing had to change), 2 bad input (a key of another log, a proof that does not
verify, a worker key trying to change the key set), 4 store failure.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from truss_cli._ctx import Ctx, table
from truss_cli._signals import stop_on_signals

from truss._errors import UsageError

if TYPE_CHECKING:
    from truss.ledger.keyhistory import KeyHistory
    from truss.ledger.keys import TrustedKeys
    from truss.ledger.stores import LedgerStore

__all__ = ["publish_checkpoints", "register_keys"]


def register_keys(
    commands: Any,
    add_trusted_key_arg: Callable[[argparse.ArgumentParser], None],
    trusted_from_args: Callable[[argparse.Namespace, Ctx], TrustedKeys],
) -> argparse.ArgumentParser:
    """Add ``ledger keys`` to ``commands``; ``cmd_ledger`` hands in its shared helpers."""
    p: argparse.ArgumentParser = commands.add_parser(
        "keys",
        help="the log's key set: the log key and the worker keys it admitted",
        description="List or change the set of keys whose entries verify in this ledger. The log key (the "
        "key the log was created with, or a key rotated from it) signs checkpoints and admits or removes "
        "worker keys; each worker signs its own entries with its own identity key.",
    )
    actions = p.add_subparsers(dest="keys_command", metavar="ACTION")
    listing = actions.add_parser(
        "list",
        help="every key of the log, its role and the log indexes it signs",
        description="Follow the key statements in the log (rotations, admissions, removals) from the trusted "
        "key(s) and print each key with its role (log or worker) and the log indexes it signs.",
    )
    add_trusted_key_arg(listing)

    def list_handler(args: argparse.Namespace, ctx: Ctx) -> int:
        return list_keys(args, ctx, trusted_from_args(args, ctx))

    listing.set_defaults(handler=list_handler)
    add = actions.add_parser(
        "add-worker",
        help="admit a worker's identity key (run it in the home holding the log key)",
        description="Append a key_admitted statement, signed by this home's log key, admitting the worker key "
        "VKEY from the next log index on; PROOF is the worker's consent, both as `truss init --join` printed "
        "them on the worker. Then sign a checkpoint covering it. Admitting a key already admitted does nothing.",
    )
    add.add_argument("vkey", metavar="VKEY", help="the worker's verifier key")
    add.add_argument("proof", metavar="PROOF", help="the worker's join proof (base64)")
    add.set_defaults(handler=add_worker)
    remove = actions.add_parser(
        "remove-worker",
        help="take a worker key out of the key set (run it in the home holding the log key)",
        description="Append a key_removed statement, signed by this home's log key: entries the worker key "
        "VKEY signs after it do not verify, and the store refuses its appends from then on.",
    )
    remove.add_argument("vkey", metavar="VKEY", help="the worker's verifier key")
    remove.set_defaults(handler=remove_worker)
    return p


def _history(store: LedgerStore, trusted: TrustedKeys) -> KeyHistory:
    from truss.ledger.keyhistory import follow_rotations, log_entries

    return follow_rotations(log_entries(store), trusted, origin=store.origin)


def list_keys(args: argparse.Namespace, ctx: Ctx, trusted: TrustedKeys) -> int:
    with ctx.open_runtime(signing=False) as runtime:
        history = _history(runtime.store, trusted)
    rows: list[list[str]] = []
    for period in history.periods:
        until = "..." if period.until_index is None else str(period.until_index - 1)
        how = "trusted start" if period.statement is None else f"{period.statement.kind} at {period.statement.index}"
        if period.until_index is not None and period.statement is not None and period.role == "worker":
            how += " (ended)"
        rows.append([period.key.key_id, period.role, str(period.from_index), until, how])
    human = table(rows, ["KEY ID", "ROLE", "FROM INDEX", "TO INDEX", "INTRODUCED BY"]) + "\n"
    human += "\n".join(f"{p.key.key_id}  {p.key.vkey}" for p in history.periods)
    ctx.emit({"periods": history.to_json()}, human)
    return 0


def _log_key_history(ctx: Ctx, store: LedgerStore, signer_vkey: str, action: str) -> KeyHistory:
    """The key history from this home's trust root, checked to make this home's key a current log key."""
    from truss.keyring import trust_root
    from truss.ledger.keys import TrustedKeys

    history = _history(store, TrustedKeys(trust_root(ctx.key)))
    size, _ = store.tree_head()
    if not any(p.key.vkey == signer_vkey and p.role == "log" and p.covers(size) for p in history.periods):
        raise UsageError(
            f"this home's identity key is not the log key of {store.origin!r}, so it cannot {action}",
            remedy="run it in the home holding the log key (the key the ledger was created with, or its rotation)",
        )
    return history


def add_worker(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.ledger.keyhistory import admission_record, append_to_log
    from truss.ledger.keys import VerifierKey
    from truss.ledger.note import sign_checkpoint

    worker = VerifierKey.parse(args.vkey)
    with ctx.open_runtime() as runtime:
        store, key = runtime.store, runtime.signer
        if worker.name != store.origin:
            raise UsageError(
                f"the worker key is named {worker.name!r}; every key of this log is named {store.origin!r}",
                remedy="on the worker, run `truss init --join URL --log-key VKEY` against this ledger",
            )
        history = _log_key_history(ctx, store, key.verifier.vkey, "admit workers")
        if any(p.key == worker and p.until_index is None for p in history.periods):
            ctx.emit({"vkey": worker.vkey, "admitted": True, "changed": False}, f"already admitted: {worker.key_id}")
            return 0
        if any(p.key == worker for p in history.periods):
            raise UsageError(
                f"the key {worker.key_id} was removed from or rotated out of this log; it is not admitted again",
                remedy="make the worker a new key (a new --home, then `truss init --join`) and admit that",
            )
        [entry] = append_to_log(store, [admission_record(worker, args.proof)])
        checkpoint = sign_checkpoint(store, key)
    ctx.emit(
        {"vkey": worker.vkey, "admitted": True, "changed": True, "from_index": entry.index + 1,
         "statement": entry.to_json(), "checkpoint_size": checkpoint.size},
        f"admitted worker key {worker.key_id}: its entries verify from log index {entry.index + 1}",
    )  # fmt: skip
    return 0


def remove_worker(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.ledger.keyhistory import append_to_log, removal_record
    from truss.ledger.keys import VerifierKey
    from truss.ledger.note import sign_checkpoint

    worker = VerifierKey.parse(args.vkey)
    with ctx.open_runtime() as runtime:
        store, key = runtime.store, runtime.signer
        history = _log_key_history(ctx, store, key.verifier.vkey, "remove workers")
        open_period = [p for p in history.periods if p.key == worker and p.role == "worker" and p.until_index is None]
        if not open_period:
            if any(p.key == worker and p.role == "worker" for p in history.periods):
                ctx.emit({"vkey": worker.vkey, "removed": True, "changed": False}, f"already removed: {worker.key_id}")
                return 0
            raise UsageError(
                f"the key {worker.key_id} is not a worker key of this log",
                remedy="`truss ledger keys list` shows the log's keys and their roles",
            )
        [entry] = append_to_log(store, [removal_record(worker)])
        checkpoint = sign_checkpoint(store, key)
    ctx.emit(
        {"vkey": worker.vkey, "removed": True, "changed": True, "until_index": entry.index + 1,
         "statement": entry.to_json(), "checkpoint_size": checkpoint.size},
        f"removed worker key {worker.key_id}: entries it signs after log index {entry.index} do not verify",
    )  # fmt: skip
    return 0


def publish_checkpoints(ctx: Ctx, every: str) -> int:
    """``ledger checkpoint --every DURATION``: sign a checkpoint whenever the log grew, until SIGTERM or
    Ctrl-C; the publisher a deployment of workers runs in the home holding the log key."""
    from truss._clock import parse_duration_ms
    from truss.ledger.note import sign_checkpoint
    from truss.ledger.workers import is_worker_key

    try:
        interval_ms = parse_duration_ms(every)
    except ValueError:
        raise UsageError(f"--every {every!r} is not a duration", remedy="write e.g. 1s or 250ms") from None
    if interval_ms <= 0:
        raise UsageError("--every is a duration above zero", remedy="write e.g. 1s or 250ms")
    signed = 0
    with stop_on_signals() as stop, ctx.open_runtime() as runtime:
        store, key = runtime.store, runtime.signer
        if is_worker_key(store, key):
            raise UsageError(
                "this home's key is a worker key: checkpoints are signed by the log key only",
                remedy="run the publisher in the home holding the log key",
            )
        ctx.progress(f"publishing checkpoints of {store.origin} every {every} (stop with Ctrl-C or SIGTERM)")
        last = -1
        while True:
            size, _ = store.tree_head()
            if size > 0 and size != last:
                checkpoint = sign_checkpoint(store, key)
                last = checkpoint.size
                signed += 1
                ctx.progress(f"checkpoint of size {checkpoint.size}")
            if stop.wait(interval_ms / 1000):
                break
    ctx.emit({"published": signed}, f"stopped after {signed} checkpoint(s)")
    return 0
