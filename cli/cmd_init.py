"""``truss init``: create the Truss home (idempotent)."""

from __future__ import annotations

import argparse
from typing import Any

from truss_cli._ctx import Ctx


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("init", help="create the Truss home (idempotent)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, ctx: Ctx) -> int:
    created = not ctx.home.exists()
    ctx.home.mkdir(parents=True, exist_ok=True)
    ctx.home.chmod(0o700)
    (ctx.home / "logs").mkdir(exist_ok=True)
    ctx.emit(
        {"home": str(ctx.home), "created": created},
        f"{'created' if created else 'already initialised'}: {ctx.home}",
    )
    return 0
