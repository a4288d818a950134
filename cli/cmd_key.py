"""``truss key show``: print the home's verifier key (the public half of its identity key)."""

from __future__ import annotations

import argparse
from typing import Any

from truss_cli._ctx import Ctx

from truss.ledger.keys import IdentityKey


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "key",
        help="the identity key that signs this home's ledger",
        description="Inspect the identity key ($TRUSS_HOME/identity.key, or --key).",
    )
    keys = p.add_subparsers(dest="key_command", metavar="ACTION")
    show = keys.add_parser(
        "show",
        help="print the verifier key, to give auditors as --trusted-key",
        description="Print the verifier key in the C2SP form <name>+<hex key id>+<base64 key>. "
        "It is public: share it with whoever verifies this home's ledgers and bundles.",
    )
    show.set_defaults(handler=show_key)


def show_key(args: argparse.Namespace, ctx: Ctx) -> int:
    key = IdentityKey.load(ctx.key)
    ctx.emit(
        {"name": key.name, "key_id": key.key_id, "vkey": key.verifier.vkey, "file": str(ctx.key)},
        key.verifier.vkey,
    )
    return 0
