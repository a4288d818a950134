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
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, ctx: Ctx) -> int:
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
