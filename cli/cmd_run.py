"""``truss run``, ``truss resume``, ``truss approve`` and ``truss sessions``: running contracts from a terminal.

Thin: parse, open the runtime (``Ctx.open_runtime``), call ``truss.session``, render. Progress goes
to stderr (one line per call), the summary or ``--json`` document to stdout. Ctrl-C and SIGTERM
stop the run cleanly: the session is recorded as interrupted, servers are shut down, exit 3
(resumable); while ``resume`` reads and verifies the session, before it records anything, both
end the command with exit 130 and nothing written. The MCP SDK is imported only inside the
handlers that connect.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
from truss_cli._ctx import VERIFIED_NOTE, Ctx, row_limit, table, verified_cell
from truss_cli._signals import sigterm_interrupts
from truss_cli._telemetry import close_telemetry, open_telemetry, secrets_of
from truss_cli.cmd_contract import add_contract_args, load_from_args

from truss._errors import NotFoundError, UsageError
from truss.ledger.keyhistory import is_log_session

if TYPE_CHECKING:  # the session modules load only in the handlers: other commands stay fast
    from truss.events import Event
    from truss.ledger.stores import LedgerStore
    from truss.runtime import Connector
    from truss.session import RunOutcome
    from truss.telemetry import ExportStats

_STATUS_WORD = {
    "pass": "pass",
    "fail": "FAIL",
    "error": "ERROR",
    "suspended": "suspended",
    "interrupted": "interrupted",
    "diverged": "DIVERGED",
}


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "run",
        help="run a contract: every tool call through the gate, ending in a signed verdict",
        description="Run CONTRACT and print its verdict. Exit codes: 0 pass, 1 fail, 2 bad input, "
        "3 suspended (waiting for approval, or interrupted: resumable), 4 error.",
    )
    add_contract_args(p)
    p.add_argument("--session", metavar="ID", help="use this session id (an existing one prints that session)")
    p.add_argument("--no-wait", action="store_true", help="suspend instead of waiting for an MCP task to finish")
    p.set_defaults(handler=run)

    p = sub.add_parser(
        "resume",
        help="continue a suspended or interrupted session",
        description="Continue SESSION from its record: recorded model turns and tool results are "
        "replayed from the ledger, never re-requested; the first unrecorded step runs live.",
    )
    p.add_argument("session", metavar="SESSION")
    p.add_argument("--no-wait", action="store_true", help="look at pending MCP tasks once; suspend if not finished")
    p.set_defaults(handler=resume)

    p = sub.add_parser(
        "approve",
        help="approve (or --deny) a call waiting for approval",
        description="Record a decision on CALL of SESSION, which waits for approval; then "
        "`truss resume SESSION` continues the run. Without CALL: list the calls of SESSION waiting for "
        "approval (call, tool, redacted arguments, reason) and change nothing.",
    )
    p.add_argument("session", metavar="SESSION")
    p.add_argument(
        "call", metavar="CALL", nargs="?", help="the call id, e.g. c2.0 (without it: list the calls waiting)"
    )
    p.add_argument("--deny", action="store_true", help="refuse the call; the model is told it was denied")
    p.add_argument("--reason", metavar="TEXT", help="why (recorded, and shown to the model on --deny)")
    p.set_defaults(handler=approve)

    p = sub.add_parser("sessions", help="list sessions with their status")
    p.add_argument("--status", help="only sessions with this status (pass, fail, error, suspended, ...)")
    p.add_argument("--limit", type=int, default=50, help="at most this many, newest first (default 50; 0 for all)")
    p.set_defaults(handler=sessions)


# -- handlers ----------------------------------------------------------------------------------------


def run(args: argparse.Namespace, ctx: Ctx) -> int:
    # An existing --session is read and verified whole before the run's own watcher is installed:
    # SIGTERM in that stretch ends the command as Ctrl-C does (exit 130), not as a silent kill.
    with sigterm_interrupts():
        return _run(args, ctx)


def _run(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.session import check_session_id, outcome_of

    if args.session is not None:
        check_session_id(args.session)
    contract = load_from_args(args, ctx, environ=dict(os.environ))
    with ctx.open_runtime(create=True, connector=_connector(ctx, no_wait=args.no_wait)) as runtime:
        if args.session is not None and runtime.store.session(args.session) is not None:
            outcome = outcome_of(runtime.store, args.session)
            _render(ctx, outcome, note="this session already exists; showing its outcome")
            return outcome.exit_code
        telemetry = open_telemetry(ctx, runtime.environ, runtime.store)
        if telemetry is not None:
            telemetry.remember(secrets_of(contract, runtime.environ))
        watching = [telemetry] if telemetry is not None else []
        from truss.session import run_contract

        async def start(stop: anyio.Event, progress: Callable[[Event], None]) -> RunOutcome:
            live = dataclasses.replace(runtime, events=(*runtime.events, progress, *watching))
            return await run_contract(live, contract, session_id=args.session, stop=stop)

        try:
            outcome = _drive(ctx, start)
        finally:
            stats = close_telemetry(ctx, telemetry)
    _render(ctx, outcome, telemetry=stats)
    return outcome.exit_code


def resume(args: argparse.Namespace, ctx: Ctx) -> int:
    # A session whose row says it ended is verified whole before the run's own watcher is installed
    # (a long one takes seconds): SIGTERM in that stretch ends the command as Ctrl-C does (exit 130,
    # nothing written), not as a silent kill. The watcher does the same for the resume's own read.
    with sigterm_interrupts():
        return _resume(args, ctx)


def _resume(args: argparse.Namespace, ctx: Ctx) -> int:
    with ctx.open_runtime(connector=_connector(ctx, no_wait=args.no_wait)) as runtime:
        if _ended(runtime.store, args.session):
            # Nothing to continue: the outcome comes from the session's last entries, with no
            # connector, telemetry or event loop started (and so no SDK imported).
            from truss.session import outcome_of

            outcome = outcome_of(runtime.store, args.session)
            _render(ctx, outcome)
            return outcome.exit_code
        telemetry = open_telemetry(ctx, runtime.environ, runtime.store)
        watching = [telemetry] if telemetry is not None else []
        from truss.session import resume_session

        async def start(stop: anyio.Event, progress: Callable[[Event], None]) -> RunOutcome:
            live = dataclasses.replace(runtime, events=(*runtime.events, progress, *watching))
            return await resume_session(live, args.session, stop=stop)

        stopped: list[str] = []
        try:
            outcome = _drive(ctx, start, stopped=stopped)
        finally:
            stats = close_telemetry(ctx, telemetry)
        if stopped and outcome.status == "interrupted" and outcome.checkpoint is None:
            # Stopped while the session was still read and verified: nothing was recorded (an
            # interrupted run signs a checkpoint), so the command ends as Ctrl-C does (exit 130).
            raise KeyboardInterrupt("SIGTERM") if stopped[0] == "SIGTERM" else KeyboardInterrupt()
    _render(ctx, outcome, telemetry=stats)
    return outcome.exit_code


def _ended(store: LedgerStore, session: str) -> bool:
    """Whether ``session`` ended, by its verified chain, asked only when the store's unverified row
    says it is over, as ``resume_session`` asks it.

    A row that says the session goes on decides nothing: ``resume_session`` then reads and verifies
    the session once, whole, and returns the recorded outcome when that read says it ended, so
    verifying it here as well would read a long session twice. A row that says it is over is
    checked against the chain (R2), whose answer ``resume_session`` reuses rather than verifying
    again."""
    from truss.ledger.reader import unverified
    from truss.session import TERMINAL

    if is_log_session(session):  # the log's own session is no run
        return False
    listed = unverified(store).session(session)
    if listed is None or not (listed.ended or listed.status in TERMINAL):
        return False
    info = store.session(session)
    return info is not None and info.ended


def approve(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.session import approve_call

    if args.call is None:
        if args.deny or args.reason is not None:
            raise UsageError("--deny and --reason need the CALL they decide", remedy="See 'truss approve --help'")
        return _list_approvals(args.session, ctx)
    with ctx.open_runtime() as runtime:
        entry = approve_call(runtime, args.session, args.call, approved=not args.deny, reason=args.reason)
    word = "denied" if args.deny else "approved"
    ctx.emit(
        {"session": args.session, "call": args.call, "approved": not args.deny, "seq": entry.seq, "hash": entry.hash},
        f"{word} {args.call} of {args.session} (entry {entry.seq}); continue with: truss resume {args.session}",
    )
    return 0


def _list_approvals(session: str, ctx: Ctx) -> int:
    """``truss approve SESSION``: the calls waiting for a decision, read from the ledger (nothing written)."""
    import json

    from truss.session import pending_approvals

    with ctx.open_runtime(signing=False) as runtime:
        store = runtime.store
        if store.session(session) is None:
            raise NotFoundError(f"no session {session!r} in this ledger", what="session", name=session,
                                remedy="List sessions with 'truss sessions'")  # fmt: skip
        entries = list(store.read_session(session))
        waiting = set(pending_approvals(entries))
        rows: list[dict[str, Any]] = []
        for entry in entries:
            body = entry.body
            if entry.kind != "approval_requested" or str(body.get("call")) not in waiting:
                continue
            # The gate stored the arguments redacted (secret_args, known secret values scrubbed).
            raw = store.blob(str(body.get("args"))) if body.get("args") else None
            try:
                arguments: Any = json.loads(raw) if raw is not None else None
            except ValueError:
                arguments = None
            rows.append({
                "call": str(body.get("call")),
                "tool": str(body.get("tool")),
                "arguments": arguments,
                "arguments_erased": raw is None,
                "reason": body.get("reason"),
                "rule": body.get("rule"),
                "seq": entry.seq,
            })  # fmt: skip
    if not rows:
        human = f"no call of {session} is waiting for approval"
    else:
        lines = [f"{len(rows)} call(s) of {session} waiting for approval:"]
        for row in rows:
            args_text = "(erased)" if row["arguments_erased"] else json.dumps(row["arguments"], ensure_ascii=False)
            if len(args_text) > 200:
                args_text = args_text[:199] + "…"
            lines.append(f"  {row['call']}  {row['tool']}  {args_text}")
            if row["reason"]:
                lines.append(f"      reason: {row['reason']}")
        lines.append(f"decide with: truss approve {session} CALL [--deny] [--reason TEXT]")
        human = "\n".join(lines)
    ctx.emit({"session": session, "waiting": rows}, human)
    return 0


def sessions(args: argparse.Namespace, ctx: Ctx) -> int:
    with ctx.open_runtime(signing=False) as runtime:
        limit = row_limit(args.limit)
        # The log's own session (key rotations, witness outcomes) is not a run.
        listed = runtime.store.sessions(status=args.status, limit=None if limit is None else limit + 1)
        rows = [r for r in listed if not is_log_session(r.id)][:limit]
    data = [r.to_json() for r in rows]
    human = table(
        [
            [r.id, r.contract or "-", r.status, str(r.entries), _when(r.started_ms), verified_cell(r.verified)]
            for r in rows
        ],
        ["SESSION", "CONTRACT", "STATUS", "ENTRIES", "STARTED (UTC)", "VERIFIED"],
    )
    if any(r.verified != "chain" for r in rows):
        human += f"\n({VERIFIED_NOTE})"
    ctx.emit({"sessions": data}, human if rows else "no sessions")
    return 0


# -- helpers -----------------------------------------------------------------------------------------


def protected_paths(ctx: Ctx) -> list[str]:
    """Never visible inside a server's sandbox, wherever --home, --key and --db put them."""
    protected = [str(ctx.home), str(ctx.key)]
    db = ctx.db.removeprefix("sqlite://") if ctx.db.startswith("sqlite:///") else ctx.db
    if "://" not in db and not db.endswith(":"):  # a file, not another store's URL (memory:)
        protected += [db, f"{db}-wal", f"{db}-shm", f"{db}-journal"]
    return protected


def _connector(ctx: Ctx, *, no_wait: bool = False) -> Connector:
    """The MCP client tier (``truss.mcp.client.connect``), imported only when a run connects."""
    verbose = ctx.verbose
    definitions = ctx.definitions()  # every definition seen, by pin: a pin mismatch can say what changed
    protected = protected_paths(ctx)

    def connector(contract: Any, **kwargs: Any) -> AbstractAsyncContextManager[Any]:
        from truss.mcp.client import connect
        from truss.mcp.oauth import OAuthFlows

        # OAuth servers get their token from the home's store and never wait for a person (docs/oauth.md).
        auth = OAuthFlows.for_home(ctx.home, ctx.clock)
        return connect(
            contract,
            verbose=verbose,
            no_wait=no_wait,
            auth=auth,
            definitions=definitions,
            protected=protected,
            **kwargs,
        )

    return connector


def _drive(
    ctx: Ctx, start: Callable[[anyio.Event, Callable[[Event], None]], Any], *, stopped: list[str] | None = None
) -> RunOutcome:
    """Run ``start`` with a stop event that Ctrl-C and SIGTERM set, printing progress lines.

    With ``stopped``, the name of each signal received goes there too, and the line saying the run
    stops is printed only once the run has shown an event: before that a resume is still reading
    its session, and a stop there records nothing (its caller says so)."""
    printer = _Progress(ctx)
    seen: list[Event] = []
    stopping = "truss: {} received: stopping the run and recording it as interrupted"

    def progress(event: Event) -> None:
        if not seen:
            seen.append(event)
            for name in stopped or ():  # the stop came before the run's first event
                ctx.progress(stopping.format(name))
        printer(event)

    async def main() -> RunOutcome:
        stop = anyio.Event()
        outcome: RunOutcome | None = None
        async with anyio.create_task_group() as group:

            async def watch(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    task_status.started()
                    async for signum in signals:
                        name = signal.Signals(signum).name
                        if stopped is not None:
                            stopped.append(name)
                        if stopped is None or seen:
                            ctx.progress(stopping.format(name))
                        stop.set()

            # The watcher holds SIGINT and SIGTERM before the run starts: a signal while a resume
            # reads its session (in a worker thread) sets ``stop`` and is seen once the read is in.
            await group.start(watch)
            outcome = await start(stop, progress)
            group.cancel_scope.cancel()
        assert outcome is not None
        return outcome

    try:
        return anyio.run(main)
    except BaseExceptionGroup as group:
        # The signal watcher never fails: a group holds the run's one error; let the one handler see it.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


class _Progress:
    """A subscriber of the run's events (``truss.events``) that prints one stderr line per call:
    call id, tool, outcome, duration, what is left of the budget; one per panel reviewer (name,
    outcome, reason); with ``-v`` also model turns and the servers' progress messages."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx

    def __call__(self, event: Event) -> None:
        from truss.events import CallEnded, CheckpointWitnessed, ModelAnswered, PanelReviewed, ToolProgress

        if isinstance(event, CallEnded) and event.outcome != "error":  # an error is the run's to report
            outcome = event.outcome
            if event.code and outcome in ("denied", "failed"):
                outcome += f" ({event.code})"
            duration = f"{event.duration_ms:.1f} ms" if event.duration_ms else "-"
            replayed = "  (replayed)" if event.replayed else ""
            if event.memo_from is not None:
                replayed += f"  (memo hit: result recorded by {event.memo_from}, not sent)"
            left = _left(event.budget_left)
            self.ctx.progress(f"  {event.call:<6} {event.tool}  {outcome}  {duration}  left: {left}{replayed}")
        elif isinstance(event, PanelReviewed):
            replayed = "  (replayed)" if event.replayed else ""
            who = f"{event.reviewer} ({event.provider})"
            self.ctx.progress(f"  review {who}  {event.outcome}  {event.reason}{replayed}")
        elif isinstance(event, ToolProgress) and self.ctx.verbose:
            self.ctx.progress(f"  {event.call:<6} {event.tool}  progress {event.detail}")
        elif isinstance(event, ModelAnswered) and self.ctx.verbose:
            self.ctx.progress(f"  model turn {event.turn}{'  (replayed)' if event.replayed else ''}")
        elif isinstance(event, CheckpointWitnessed):
            self.ctx.progress(f"  witness {event.summary}")


def _left(left: Mapping[str, Any]) -> str:
    parts = [f"{k} {v}" for k, v in left.items() if k in ("tool_calls", "model_turns", "tokens", "seconds")]
    return ", ".join(parts) or "-"


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _render(ctx: Ctx, outcome: RunOutcome, note: str | None = None, telemetry: ExportStats | None = None) -> None:
    data = outcome.to_json()
    if note:
        data["note"] = note
    if telemetry is not None:
        data["telemetry"] = telemetry.to_json()
    lines: list[str] = []
    if note:
        lines.append(note)
    status = outcome.status
    lines.append(f"verdict     {_STATUS_WORD.get(status, status)}")
    verdict = outcome.verdict or {}
    checks: list[Any] = list(verdict.get("checks") or [])
    if checks:
        passed = sum(1 for c in checks if c.get("ok"))
        lines.append(f"checks      {passed}/{len(checks)} passed")
        for c in checks:
            mark = "ok  " if c.get("ok") else "FAIL"
            lines.append(f"  {mark} {c.get('kind')}: {c.get('detail')}")
    if outcome.reason and status != "pass":
        lines.append(f"reason      {outcome.reason}")
    lines.append(f"session     {outcome.session}")
    if outcome.head:
        lines.append(f"head        {outcome.head}")
    if outcome.checkpoint:
        size = outcome.checkpoint.split("\n")[1] if outcome.checkpoint.count("\n") >= 2 else "?"
        lines.append(f"anchor      signed checkpoint of the log at size {size}")
    if status in ("pass", "fail", "error"):
        lines.append(f"verify      truss ledger verify {outcome.session}")
    elif status == "suspended" and outcome.waiting and outcome.waiting_on == "in_doubt":
        for call in outcome.waiting:
            lines.append(f"in doubt    {call}: find out whether it happened, then")
            how = "--result JSON | --failed REASON | --not-sent"
            lines.append(f"            truss resolve {outcome.session} {call} {how}")
        lines.append(f"then        truss resume {outcome.session}")
    elif status == "suspended" and outcome.waiting and outcome.waiting_on == "signal":
        for call in outcome.waiting:
            lines.append(f"waiting     {call}: truss signal {outcome.session} NAME --payload JSON|@FILE")
        lines.append(f"then        truss resume {outcome.session}")
    elif status == "suspended" and outcome.waiting and outcome.waiting_on == "task":
        for call in outcome.waiting:
            lines.append(f"waiting     {call}: an MCP task still runs; resuming polls the same task")
        lines.append(f"then        truss resume {outcome.session}")
    elif status == "suspended" and outcome.waiting:
        for call in outcome.waiting:
            lines.append(f"waiting     {call}: truss approve {outcome.session} {call}   (or --deny)")
        lines.append(f"then        truss resume {outcome.session}")
    elif status == "interrupted" and outcome.head is None:
        lines.append("recorded    nothing: the run stopped before its session started; run it again")
    elif status in ("suspended", "interrupted"):
        lines.append(f"resumable   truss resume {outcome.session}")
    ctx.emit(data, "\n".join(lines))
