"""``truss ledger migrate --from LEDGER --to postgresql://...``: copy a ledger, verifying on the way.

Thin: open the source read-only, the target as a new PostgreSQL ledger named after the source's
log, call ``truss.ledger.stores.migrate.migrate_ledger``, render (docs/postgresql.md). Exit 0
copied and verified, 1 the source does not verify (nothing copied), 2 bad input (no source, a
``--to`` that is not PostgreSQL, a password in the URL, psycopg missing), 4 store failure or a
target that already holds a ledger.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from truss_cli._ctx import Ctx

from truss._errors import UsageError

if TYPE_CHECKING:
    from truss.ledger.keys import TrustedKeys

__all__ = ["register_migrate"]


def register_migrate(
    commands: Any,
    add_trusted_key_arg: Callable[[argparse.ArgumentParser], None],
    trusted_from_args: Callable[[argparse.Namespace, Ctx], TrustedKeys],
) -> argparse.ArgumentParser:
    """Add ``ledger migrate`` to ``commands``; ``cmd_ledger`` hands in its shared helpers."""
    p: argparse.ArgumentParser = commands.add_parser(
        "migrate",
        help="copy a ledger into an empty PostgreSQL ledger, verifying every entry on the way",
        description="Copy the ledger --from (a SQLite file, by default this home's) into the empty PostgreSQL "
        "ledger --to. Entries keep their bytes and signatures, so the copy verifies with the same keys; each "
        "is checked as `truss ledger verify --all` checks it before it is copied, in one transaction: if "
        "anything does not verify, nothing is written.",
    )
    p.add_argument("--from", dest="source", metavar="LEDGER", help="the ledger to copy (default: --db)")
    p.add_argument("--to", dest="target", metavar="URL", required=True, help="an empty postgresql:// ledger")
    add_trusted_key_arg(p)

    def handler(args: argparse.Namespace, ctx: Ctx) -> int:
        return migrate(args, ctx, trusted_from_args(args, ctx))

    p.set_defaults(handler=handler)
    return p


def migrate(args: argparse.Namespace, ctx: Ctx, trusted: TrustedKeys) -> int:
    from truss.ledger.stores import open_store, redact_url, store_scheme

    if store_scheme(args.target) not in {"postgresql", "postgres"}:
        raise UsageError(
            f"--to {redact_url(args.target)!r} is not a postgresql:// URL",
            remedy="migrate into PostgreSQL: --to postgresql://[USER@]HOST/DATABASE (docs/postgresql.md)",
            what="to",
        )
    try:
        from truss.ledger.stores.migrate import migrate_ledger, open_target
    except ImportError as exc:
        raise UsageError(
            "truss ledger migrate: the PostgreSQL store needs psycopg, which is not installed",
            remedy="pip install 'truss[postgres]' (docs/postgresql.md)",
            missing=exc.name,
        ) from exc
    source_url = args.source or ctx.db
    source = open_store(source_url, key=None, clock=ctx.clock, create=False)
    try:
        target = open_target(args.target, origin=source.origin, clock=ctx.clock)
        try:
            report = migrate_ledger(source, target, trusted)
        finally:
            target.close()
    finally:
        source.close()
    shown = redact_url(args.target).split("?", 1)[0]
    ctx.emit(
        {"from": redact_url(source_url), "to": shown, **report.to_json()},
        f"copied {report.entries} entries of {report.sessions} sessions, {report.checkpoints} checkpoint(s) and "
        f"{report.blobs} payload(s) to {shown}; every entry verified on the way and the copy verifies "
        f"(tree size {report.tree_size}, root {report.root[:16]}...)",
    )
    return 0
