"""``truss replay``, ``truss resolve`` and ``truss signal``: durability commands between runs.

Thin: parse, open the runtime (``Ctx.open_runtime``), call ``truss.durable``, render. None of them
connects a server or a model (``replay`` is the auditor's offline check), so none imports the MCP
SDK. Like ``run``, they open the home's ledger with its key and create it when it is missing. ``truss resume``
lives with ``run`` in ``cmd_run``.

Exit codes: ``replay`` 0 when the recomputed verdict matches the recorded one, 1 when it does not
(or the record does not follow from itself), 2 for an unknown or unfinished session; ``resolve``
and ``signal`` 0 when recorded, 2 for bad input (unknown session, call or signal, bad JSON).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from truss_cli._ctx import Ctx

from truss._errors import UsageError

MAX_PAYLOAD_FILE_BYTES = 16 << 20


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "replay",
        help="re-derive a finished session from its ledger alone and recompute its verdict",
        description="Replay SESSION with no server and no model: every recorded model turn and tool "
        "result must follow from the steps before it; the verdict is recomputed and compared with the "
        "recorded one. Exit 0 match, 1 mismatch, 2 unknown or unfinished session.",
    )
    p.add_argument("session", metavar="SESSION")
    p.set_defaults(handler=replay)

    p = sub.add_parser(
        "resolve",
        help="answer an in-doubt call (sent, but its result never recorded)",
        description="Record what happened to CALL of SESSION, which is in doubt: the result it had "
        "(--result JSON), that it failed (--failed REASON) or that it was never sent (--not-sent: resume "
        "sends it). Then `truss resume SESSION` continues.",
    )
    p.add_argument("session", metavar="SESSION")
    p.add_argument("call", metavar="CALL", help="the call id, e.g. c2.0 (shown when the run stopped)")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--result", metavar="JSON", help="the call's result: a tool result object, a string or any JSON")
    how.add_argument("--failed", metavar="REASON", help="the call failed; the model is told REASON")
    how.add_argument("--not-sent", action="store_true", help="the call never reached the server: send it on resume")
    p.set_defaults(handler=resolve)

    p = sub.add_parser(
        "signal",
        help="deliver the result a pending async call waits for",
        description="Record PAYLOAD as the result of the call of SESSION waiting for signal NAME "
        "([[mcp.servers.async]]); then `truss resume SESSION` continues.",
    )
    p.add_argument("session", metavar="SESSION")
    p.add_argument("name", metavar="NAME", help="the signal name (the value the pending result gave)")
    p.add_argument("--payload", metavar="JSON|@FILE", required=True, help="the result, as JSON or @file holding JSON")
    p.set_defaults(handler=signal)


def replay(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.durable import replay_session

    with ctx.open_runtime(create=True) as runtime:
        import anyio

        report = anyio.run(replay_session, runtime, args.session)
    recorded = report.recorded.get("status")
    replayed = (report.replayed or {}).get("status", "-")
    lines = [
        f"replay      {'matches' if report.matches else 'DOES NOT MATCH'}",
        f"recorded    {recorded}",
        f"replayed    {replayed}",
        f"steps       {report.turns} model turns, {report.calls} tool calls"
        + (f", {report.reviews} panel reviews" if report.reviews else "")
        + ", all from the ledger",
        f"session     {report.session}",
    ]
    if report.reason:
        lines.insert(1, f"reason      {report.reason}")
    ctx.emit(report.to_json(), "\n".join(lines))
    return 0 if report.matches else 1


def resolve(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.durable import parse_payload, resolve_call

    result = parse_payload(args.result, what="--result") if args.result is not None else None
    with ctx.open_runtime(create=True) as runtime:
        entry = resolve_call(
            runtime, args.session, args.call, result=result, failed=args.failed, not_sent=bool(args.not_sent)
        )
    resolution = entry.body.get("resolution")
    ctx.emit(
        {"session": args.session, "call": args.call, "resolution": resolution, "seq": entry.seq, "hash": entry.hash},
        f"resolved {args.call} of {args.session} as {resolution} (entry {entry.seq}); "
        f"continue with: truss resume {args.session}",
    )
    return 0


def signal(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.durable import deliver_signal, parse_payload

    text: str = args.payload
    if text.startswith("@"):
        text = _read_payload_file(Path(text[1:]))
    payload = parse_payload(text, what="--payload")
    with ctx.open_runtime(create=True) as runtime:
        entry = deliver_signal(runtime, args.session, args.name, payload)
    ctx.emit(
        {"session": args.session, "signal": args.name, "call": entry.body.get("call"), "seq": entry.seq},
        f"delivered signal {args.name!r} to call {entry.body.get('call')} of {args.session} (entry {entry.seq}); "
        f"continue with: truss resume {args.session}",
    )
    return 0


def _read_payload_file(path: Path) -> str:
    try:
        if path.stat().st_size > MAX_PAYLOAD_FILE_BYTES:
            raise UsageError(f"payload file {path} is larger than {MAX_PAYLOAD_FILE_BYTES} bytes",
                             remedy="Give a smaller payload")  # fmt: skip
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read payload file {path}: {exc.strerror}", remedy="Check the path") from None
    except UnicodeDecodeError:
        raise UsageError(f"payload file {path} is not UTF-8 text", remedy="Give a JSON file") from None
