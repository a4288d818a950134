"""``truss init``: create the Truss home and its identity key (idempotent)."""

from __future__ import annotations

import argparse
from typing import Any

from truss_cli._ctx import Ctx

from truss._errors import UsageError
from truss.ledger.keys import IdentityKey
from truss.ledger.stores import redact_url


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "init",
        help="create the Truss home and its identity key (idempotent)",
        description="Create the home directory (mode 0700) and, if absent, the identity key that signs "
        "its ledger (identity.key, mode 0600). Prints the verifier key to give auditors.",
    )
    p.add_argument(
        "--name",
        metavar="ORIGIN",
        help="the log's name for a new key, e.g. example.com/truss (default: truss.local/<key hash>)",
    )
    p.add_argument(
        "--join",
        metavar="URL",
        help="make this home a worker of the existing shared ledger URL: its own key named after that log, "
        "the ledger in [harness] db, and the join request to admit it with (needs --log-key)",
    )
    p.add_argument(
        "--log-key",
        metavar="VKEY",
        help="with --join: the log key's verifier key (`truss key show` in the home holding it), which this "
        "home's verification starts from",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, ctx: Ctx) -> int:
    if args.join is not None or args.log_key is not None:
        return join(args, ctx)
    created = not ctx.home.exists()
    ctx.home.mkdir(parents=True, exist_ok=True)
    ctx.home.chmod(0o700)
    (ctx.home / "logs").mkdir(exist_ok=True)
    key_created = not ctx.key.exists()
    key = IdentityKey.create(ctx.key, args.name) if key_created else IdentityKey.load(ctx.key)
    if args.name and key.name != args.name:
        raise UsageError(
            f"the identity key {ctx.key} already names the log {key.name!r}, not {args.name!r}",
            remedy="drop --name, or use a new --home for a new log",
        )
    # An empty ledger now, so reading commands work before the first run.
    ctx.open_runtime(create=True).close()
    lines = [
        f"{'created' if created else 'already initialised'}: {ctx.home}",
        f"{'created identity key' if key_created else 'identity key'}: {ctx.key}",
        f"ledger: {redact_url(ctx.db)}",
        f"verifier key: {key.verifier.vkey}",
    ]
    ctx.emit(
        {
            "home": str(ctx.home),
            "created": created,
            "key": str(ctx.key),
            "key_created": key_created,
            "db": redact_url(ctx.db),
            "vkey": key.verifier.vkey,
        },
        "\n".join(lines),
    )
    return 0


def join(args: argparse.Namespace, ctx: Ctx) -> int:
    """``init --join URL --log-key VKEY``: a worker home of a shared ledger (docs/postgresql.md)."""
    import json
    from contextlib import closing

    from truss.contract.harness_db import operator_db
    from truss.keyring import read_root, write_root
    from truss.ledger.keyhistory import LOG_SESSION, join_request
    from truss.ledger.keys import TrustedKeys, VerifierKey
    from truss.ledger.reader import VerifiedStore
    from truss.ledger.stores import open_store
    from truss.ledger.workers import worker_vkeys

    if args.join is None or args.log_key is None:
        raise UsageError("--join URL and --log-key VKEY go together", remedy="give both (docs/postgresql.md)")
    if args.name:
        raise UsageError("--join takes the log's name from the ledger; drop --name", remedy="drop --name")
    log_key = VerifierKey.parse(args.log_key)
    with closing(open_store(args.join, key=None, clock=ctx.clock, create=False)) as store:
        origin = store.origin
        if log_key.name != origin:
            raise UsageError(
                f"--log-key names the log {log_key.name!r}, but {redact_url(args.join)} is the log {origin!r}",
                remedy="give the verifier key `truss key show` prints in the home holding this ledger's log key",
            )
        # "admitted" is read from @log as the log key signed it (an admission anyone else wrote is
        # refused as tampering), not from whatever rows the shared store holds.
        log = VerifiedStore(store, TrustedKeys([log_key]))
        log_entries = list(log.read_session(LOG_SESSION)) if store.session(LOG_SESSION) is not None else []
    known = read_root(ctx.key)
    if known is not None and known != log_key:
        raise UsageError(
            f"this home already joined with the log key {known.key_id}, not {log_key.key_id}",
            remedy="use a new --home for another log",
        )
    created = not ctx.home.exists()
    ctx.home.mkdir(parents=True, exist_ok=True)
    ctx.home.chmod(0o700)
    (ctx.home / "logs").mkdir(exist_ok=True)
    key_created = not ctx.key.exists()
    key = IdentityKey.create(ctx.key, origin) if key_created else IdentityKey.load(ctx.key)
    if key.name != origin:
        raise UsageError(
            f"the identity key {ctx.key} names the log {key.name!r}, not {origin!r}",
            remedy="use a new --home for a worker of this log",
        )
    if key.verifier == log_key:
        raise UsageError(
            "this home holds the log key itself; a worker has a key of its own",
            remedy="run `truss init --join` in another home (on the worker's host)",
        )
    write_root(ctx.key, log_key)
    config = ctx.home / "config.toml"
    if not config.exists():
        config.write_text(f"[harness]\ndb = {json.dumps(args.join)}\n", encoding="utf-8")
        configured = True
    else:
        configured = operator_db(ctx.home) == args.join
    proof = join_request(key)
    admitted = key.verifier.vkey in worker_vkeys(log_entries)
    command = f"truss ledger keys add-worker '{key.verifier.vkey}' '{proof}'"
    lines = [
        f"{'created' if created else 'already initialised'}: {ctx.home}",
        f"{'created worker key' if key_created else 'worker key'}: {ctx.key} (log {origin!r})",
        f"ledger: {redact_url(args.join)}"
        + ("" if configured else f" (not written: {config} exists; set [harness] db there or pass --db)"),
        f"trusts the log key: {log_key.vkey}",
        f"worker verifier key: {key.verifier.vkey}",
        "admitted: yes" if admitted else f"to admit it, run in the home holding the log key:\n  {command}",
    ]
    ctx.emit(
        {
            "home": str(ctx.home),
            "key": str(ctx.key),
            "key_created": key_created,
            "db": redact_url(args.join),
            "configured": configured,
            "origin": origin,
            "log_key": log_key.vkey,
            "vkey": key.verifier.vkey,
            "proof": proof,
            "admitted": admitted,
        },
        "\n".join(lines),
    )
    return 0
