"""``truss status``: the operator's view of unfinished sessions and quota use (docs/operations.md).

Thin: open the home's ledger read-only (``Ctx.open_runtime(signing=False)``), call
``truss.operator_status``, render. It takes no lease and writes nothing, so it never blocks a run.
Exit 0; 2 for a home without a ledger.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from truss_cli._ctx import Ctx, row_limit


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "status",
        help="unfinished sessions (with the command that moves each on) and every quota's use",
        description="List the sessions that have not ended: running (with the owner driving it), "
        "interrupted, waiting for approval, a signal or an asynchronous tool, or in doubt, each with the "
        "command that settles it; and every quota across runs with its use in its window, the runs "
        "holding it and when it frees up. Reads without taking any lease: it never blocks a run.",
    )
    p.add_argument("--limit", type=int, default=100, metavar="N", help="at most N unfinished sessions (default 100)")
    p.set_defaults(handler=status)


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _amounts(used: dict[str, Any], limit: dict[str, Any]) -> str:
    parts: list[str] = []
    for name in ("runs", "tool_calls", "tokens"):
        cap = limit.get(name)
        if cap is None and not used.get(name):
            continue
        parts.append(f"{name.replace('_', ' ')} {used.get(name, 0)}" + (f"/{cap}" if cap is not None else ""))
    return ", ".join(parts) or "nothing"


def status(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.operator_status import operator_status

    limit = row_limit(args.limit)
    with ctx.open_runtime(signing=False) as runtime:
        report = operator_status(runtime.store, now_ms=runtime.clock.now_ms(), limit=limit)
    lines: list[str] = []
    unfinished: list[dict[str, Any]] = report["unfinished"]
    lines.append(f"unfinished sessions: {len(unfinished)}")
    for item in unfinished:
        what = item["waiting_on"] or "running"
        head = f"  {item['session']}  {item['contract'] or '-'}  {item['status']}"
        if item["waiting_on"]:
            head += f", waiting on {what.replace('_', ' ')}"
        if item["calls"]:
            head += f" ({', '.join(item['calls'])})"
        owner = item.get("owner")
        if owner:
            head += f"; owner {owner.get('id')} on {owner.get('host')} pid {owner.get('pid')}"
        lines.append(head)
        if item.get("detail"):
            lines.append(f"      {item['detail']}")
        lines.extend(f"      {command}" for command in item["commands"])
    quotas: list[dict[str, Any]] = report["quotas"]
    lines.append(f"quotas in use: {len(quotas)}")
    for q in quotas:
        held = f"; held by {', '.join(q['held_by'])}" if q["held_by"] else ""
        lines.append(f"  {q['quota']}: {_amounts(q['used'], q['limit'])}{held}; next frees {_when(q['next_frees_ms'])}")
    ctx.emit(report, "\n".join(lines))
    return 0
