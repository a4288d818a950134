"""``truss ledger list|show|verify|export|verdict|checkpoint|erase``: read, check, export and prune the ledger.

Thin: open the runtime (``Ctx.open_runtime``), call ``truss.ledger``, render. ``register`` builds
the ``ledger`` command and keeps its sub-parsers in ``LEDGER_PARSERS`` so further sub-commands and
flags can be added in one place; ``trusted_from_args`` is the helper other commands share.

Exit codes: 0 ok / verified, 1 does not verify, 2 unusable input (no ledger, unknown session, bad
key), 4 store failure. Reading commands never create a ledger file.
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from truss_cli._ctx import VERIFIED_NOTE, Ctx, row_limit, table, verified_cell
from truss_cli._witnessed import (
    add_policy_args,
    policy_for_bundle,
    policy_for_notes,
    policy_for_store,
    read_notes,
    read_policy,
    render_policy_failure,
    store_history,
)

from truss._errors import BundleFormatError, KeyFileError, NotFoundError, UsageError, VerificationError, WitnessError
from truss.keyring import trust_root
from truss.ledger import audit
from truss.ledger.entry import StoredEntry
from truss.ledger.envelope import VerdictStatement, parse_envelope
from truss.ledger.keyhistory import is_log_session
from truss.ledger.keys import TrustedKeys, VerifierKey
from truss.ledger.note import MAX_NOTE_BYTES
from truss.ledger.reader import unverified
from truss.ledger.stores import LedgerStore, SessionInfo
from truss.ledger.verification import VerifyReport
from truss.ledger.workers import end_checkpoint
from truss.runtime import Runtime
from truss.turns import RequestFold

if TYPE_CHECKING:  # the bundle, witness-policy and panel code load in the handlers that use them
    from truss.ledger.witnessed import PolicyReport

LEDGER_PARSERS: dict[str, argparse.ArgumentParser] = {}
"""The ``ledger`` sub-parsers by name, filled by ``register``."""

_PREVIEW_CHARS = 160


# -- shared helpers ------------------------------------------------------------------------------


def _open_readonly(ctx: Ctx) -> Runtime:
    """The home's ledger for reading and verifying: no key, and a missing ledger is refused."""
    return ctx.open_runtime(signing=False)


def add_trusted_key_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trusted-key",
        action="append",
        default=[],
        metavar="VKEY",
        help="a verifier key (as `truss key show` prints it) or a file of them, one a line; repeatable "
        "(default: this home's own key)",
    )


def trusted_from_args(args: argparse.Namespace, ctx: Ctx) -> TrustedKeys:
    """``--trusted-key`` values (vkey text or files of vkeys), else the home's own (first) verifier key."""
    texts: list[str] = list(getattr(args, "trusted_key", None) or [])
    trusted = TrustedKeys()
    for text in texts:
        for line in _vkey_lines(text):
            trusted.add(VerifierKey.parse(line))
    if texts:
        return trusted
    try:
        # After a rotation, the home's first key: verification follows the rotations from it.
        for key in trust_root(ctx.key):
            trusted.add(key)
    except KeyFileError as exc:
        raise KeyFileError(
            exc.message,
            remedy="pass --trusted-key VKEY (the verifier key of the log that signed it), or fix the identity key",
            file=exc.fields.get("file"),
        ) from exc
    return trusted


def _vkey_lines(text: str) -> list[str]:
    if text.count("+") >= 2 and "\n" not in text and not Path(text).is_file():
        return [text]
    path = Path(text)
    try:
        content = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(
            f"--trusted-key {text[:60]!r} is neither a verifier key nor a readable file",
            remedy="give the line `truss key show` prints, or a file holding such lines",
            file=text,
        ) from exc
    lines = [ln.strip() for ln in content.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise KeyFileError(f"{path}: no verifier key in the file", file=str(path))
    return lines


def _time(ms: int) -> str:
    from datetime import UTC, datetime  # only the commands that print times load it (start-up of `ledger verify`)

    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _require_session(store: LedgerStore, session: str) -> SessionInfo:
    info = store.session(session)
    if info is None:
        raise NotFoundError(
            f"no session {session!r} in this ledger",
            remedy="list sessions with `truss ledger list`",
            what="session",
            name=session,
        )
    return info


# -- register ------------------------------------------------------------------------------------


# The ``ledger`` sub-commands in the order ``register`` adds them, with the help ``truss ledger --help``
# lists: the command line builds only the chosen one's parser (``register_lazy``), as ``truss_cli.main``
# does for commands (tests/cli/test_basics.py checks this table against the full ``register``).
SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("list", "sessions: id, contract, status, entries, started, head"),
    ("show", "the entries of one session, readable, with their payloads when kept"),
    ("verify", "check signatures, hash chains, indexes and payload hashes (exit 0 ok, 1 tampered, 2 bad input)"),
    ("erase", "remove a session's payload bytes; the chain still verifies"),
    ("sweep", "erase the payloads of sessions ended longer ago than [harness] keep (retention)"),
    ("export", "write one session as a self-contained, offline-verifiable bundle"),
    ("checkpoint", "sign a checkpoint of the log as it is now and print it"),
    ("verdict", "print a session's verdict envelope and verify its signature"),
    ("report", "write a self-contained HTML report of a session that verifies itself in the browser"),
    ("why", "why one call was allowed, denied, held or replayed, with the entries that record it"),
    ("migrate", "copy a ledger into an empty PostgreSQL ledger, verifying every entry on the way"),
    ("keys", "the log's key set: the log key and the worker keys it admitted"),
)
_HELP = dict(SUBCOMMANDS)


def _ledger_parser(sub: Any) -> argparse.ArgumentParser:
    return sub.add_parser(
        "ledger",
        help="list, show, verify, export, checkpoint and prune the signed ledger",
        description="Read and check the signed, hash-chained ledger of this home (--db to use another file).",
    )


def register(sub: Any) -> None:
    """The ``ledger`` command with every sub-command's parser (``truss_cli.main.build_parser``)."""
    commands = _ledger_parser(sub).add_subparsers(dest="ledger_command", metavar="SUBCOMMAND")
    for name, _ in SUBCOMMANDS:
        _BUILDERS[name](commands)


def register_lazy(sub: Any) -> None:
    """The ``ledger`` command as the command line parses it: each sub-command's parser is built (and
    its module imported) only when it is the one chosen; help, usage and errors are the real parser's."""
    parser = _ledger_parser(sub)
    commands = parser.add_subparsers(dest="ledger_command", metavar="SUBCOMMAND", parser_class=_LazySubcommand)
    for name, help_text in SUBCOMMANDS:  # the real parser has -h
        commands.add_parser(name, help=help_text, add_help=False, subcommand=name, parent=parser)


class _LazySubcommand(argparse.ArgumentParser):
    def __init__(self, *args: Any, subcommand: str, parent: argparse.ArgumentParser, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._subcommand = subcommand
        self._parent = parent

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        holder = type(self._parent)(prog=self._parent.prog, add_help=False)  # raises UsageError as the parent does
        commands = holder.add_subparsers(dest="ledger_command", metavar="SUBCOMMAND")
        _BUILDERS[self._subcommand](commands)
        return commands.choices[self._subcommand].parse_known_args(*args, **kwargs)


def _add_list(commands: Any) -> None:
    p = commands.add_parser("list", help=_HELP["list"])
    p.add_argument("--status", help="only sessions with this status")
    p.add_argument("--limit", type=int, default=50, help="at most this many, newest first (default 50; 0 for all)")
    p.set_defaults(handler=list_sessions)
    LEDGER_PARSERS["list"] = p


def _add_show(commands: Any) -> None:
    p = commands.add_parser(
        "show",
        help=_HELP["show"],
        description="Print SESSION's entries in order. Payloads (arguments, results) are shown when the "
        "ledger still holds them, and marked erased when `truss ledger erase` removed them.",
    )
    p.add_argument("session", metavar="SESSION")
    p.add_argument("--from-seq", type=int, default=0, metavar="N", help="start at entry N")
    p.add_argument("--no-payloads", action="store_true", help="do not print payload contents")
    p.add_argument("--full", action="store_true", help="print payloads whole instead of a preview")
    p.set_defaults(handler=show_session)
    LEDGER_PARSERS["show"] = p


def _add_verify(commands: Any) -> None:
    p = commands.add_parser(
        "verify",
        help=_HELP["verify"],
        description="Verify SESSION, or the whole log (--all, the default): every entry's signature against "
        "the trusted keys (never a key the ledger names for itself), prev links and seq order per session, "
        "contiguous log indexes, payload hashes, and the stored session heads. Steps: docs/ledger-format.md.",
    )
    p.add_argument("session", metavar="SESSION", nargs="?")
    p.add_argument("--all", action="store_true", help="verify the whole log (the default without SESSION)")
    add_trusted_key_arg(p)
    p.add_argument("--no-payloads", action="store_true", help="skip payload hash checks")
    p.set_defaults(handler=verify)
    LEDGER_PARSERS["verify"] = p
    _add_verify_log_args(p)


def _add_erase(commands: Any) -> None:
    p = commands.add_parser(
        "erase",
        help=_HELP["erase"],
        description="Remove the argument and result bytes SESSION recorded. Entries keep their hashes, so "
        "the session still verifies and `show` marks the payloads erased. Bytes another session also "
        "recorded stay for that session.",
    )
    p.add_argument("session", metavar="SESSION")
    p.add_argument("--payloads", action="store_true", help="required: what to erase")
    p.set_defaults(handler=erase)
    LEDGER_PARSERS["erase"] = p


def _add_sweep(commands: Any) -> None:
    p = commands.add_parser(
        "sweep",
        help=_HELP["sweep"],
        description="Retention: erase the payload bytes of every session that ended longer ago than the "
        'operator config\'s [harness] keep ("90d"; the default "forever" keeps everything), as '
        "`truss ledger erase` does one session. Unfinished sessions, sessions in doubt or waiting, and "
        "sessions whose quota reservation is not settled are never swept. serve-mcp sweeps at its start and daily.",
    )
    p.add_argument("--keep", metavar="DURATION", help='use this instead of [harness] keep ("30d", "forever")')
    p.add_argument("--dry-run", action="store_true", help="list what would be swept; erase nothing")
    p.set_defaults(handler=sweep_payloads)
    LEDGER_PARSERS["sweep"] = p


def _add_report_or_why(commands: Any, name: str) -> None:
    from truss_cli import _ledger_report  # report and why (docs/report.md), kept in their own module

    shared = _ledger_report.LedgerHelpers(add_trusted_key_arg, trusted_from_args, _open_readonly)
    LEDGER_PARSERS.update(_ledger_report.register(commands, shared, only=name))


def _add_migrate(commands: Any) -> None:
    from truss_cli._migrate import register_migrate

    LEDGER_PARSERS["migrate"] = register_migrate(commands, add_trusted_key_arg, trusted_from_args)


def _add_keys(commands: Any) -> None:
    from truss_cli._ledger_keys import register_keys  # the log's key set (docs/postgresql.md)

    LEDGER_PARSERS["keys"] = register_keys(commands, add_trusted_key_arg, trusted_from_args)


# -- handlers ------------------------------------------------------------------------------------


def list_sessions(args: argparse.Namespace, ctx: Ctx) -> int:
    with ctx.open_runtime(signing=False) as runtime:
        store = runtime.store
        limit = row_limit(args.limit)
        # The log's own session (key rotations, witness outcomes) is not a run: `ledger show @log`.
        rows = [s for s in store.sessions(status=args.status, limit=None if limit is None else limit + 1)
                if not is_log_session(s.id)][:limit]  # fmt: skip
    human = table(
        [
            [
                s.id,
                s.contract or "-",
                s.status,
                str(s.entries),
                _time(s.started_ms),
                s.head[:12],
                verified_cell(s.verified),
            ]
            for s in rows
        ],
        ["SESSION", "CONTRACT", "STATUS", "ENTRIES", "STARTED (UTC)", "HEAD", "VERIFIED"],
    )
    if not rows:
        human = "no sessions"
    else:
        if limit is not None and len(rows) == limit:
            human += f"\n(the {limit} most recent; --limit 0 for all)"
        if any(s.verified != "chain" for s in rows):
            human += f"\n({VERIFIED_NOTE})"
    ctx.emit({"sessions": [s.to_json() for s in rows]}, human)
    return 0


def _payload_view(data: bytes, *, full: bool) -> tuple[Any, str]:
    """The payload for JSON output and a one-line preview for people."""
    try:
        text = data.decode("utf-8")
        value: Any = json.loads(text)
        preview = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (UnicodeDecodeError, ValueError):
        value = {"base64": base64.b64encode(data).decode("ascii")}
        preview = f"<{len(data)} bytes, not UTF-8 JSON>"
    if not full and len(preview) > _PREVIEW_CHARS:
        preview = preview[:_PREVIEW_CHARS] + f"... ({len(data)} bytes)"
    return value, preview


def show_session(args: argparse.Namespace, ctx: Ctx) -> int:
    with ctx.open_runtime(signing=False) as runtime:
        store = runtime.store
        info = _require_session(store, args.session)
        erased = store.erased_refs(args.session)
        entries_json: list[dict[str, Any]] = []
        lines = [
            f"session {info.id}  contract {info.contract or '-'}  status {info.status}  entries {info.entries}",
            f"head {info.head}",
        ]
        # A model turn records its request as a delta on the turn before (truss.turns): the whole
        # request is folded from turn 1, so a --from-seq view still reads the turns before it.
        fold = RequestFold(store.blob) if not args.no_payloads and (ctx.json or args.full) else None
        start = 0 if fold is not None else args.from_seq
        for item in store.read_session(args.session, from_seq=start):
            request = _fold_request(fold, item)
            if item.seq < args.from_seq:
                continue
            entry_json, entry_lines = _render_entry(store, item, erased, payloads=not args.no_payloads, full=args.full)
            _panel(store, item, entry_json, entry_lines, payloads=not args.no_payloads)
            if request is not None:
                entry_json["request"] = request[0]
                entry_lines.append(f"{'':>6}request of turn {item.body.get('turn')}, rebuilt:  {request[1]}")
            entries_json.append(entry_json)
            if not ctx.json:
                lines.extend(entry_lines)
    if erased:
        lines.append(f"({len(erased)} payload(s) erased with `truss ledger erase`; their hashes remain signed)")
    ctx.emit({"session": info.to_json(), "entries": entries_json}, "\n".join(lines))
    return 0


def _panel(store: LedgerStore, item: StoredEntry, out: dict[str, Any], lines: list[str], *, payloads: bool) -> None:
    """A reviewer panel's claims, citations, findings and answers (``cli/_panel_view.py``)."""
    from truss_cli import _panel_view

    if item.kind == "verdict":
        lines.extend(_panel_view.verdict_lines(item.body))
    elif item.kind == "panel_review":
        view, review_lines = _panel_view.review_view(item.body, store.blob if payloads else lambda _: None)
        out["review"] = view
        lines.extend(review_lines)


def _fold_request(fold: RequestFold | None, item: StoredEntry) -> tuple[Any, str] | None:
    """A model turn's whole request (JSON value, text) rebuilt from the deltas so far, when it can be."""
    ref = item.body.get("request")
    if fold is None or item.kind != "model_turn" or not isinstance(ref, str):
        return None
    try:
        request = fold.add(ref)
    except VerificationError as exc:
        return None, f"(does not rebuild: {exc.message})"
    if request is None:
        return None, "(not rebuilt: a payload it builds on is not held)"
    return request, json.dumps(request, ensure_ascii=False, separators=(",", ":"))


def _render_entry(
    store: LedgerStore, item: StoredEntry, erased: set[str], *, payloads: bool, full: bool
) -> tuple[dict[str, Any], list[str]]:
    body = dict(item.body)
    summary = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    if not full and len(summary) > _PREVIEW_CHARS:
        summary = summary[:_PREVIEW_CHARS] + "..."
    lines = [f"{item.seq:>4}  #{item.index:<6} {_time(item.ts)}  {item.kind:<20} {summary}"]
    memo = _memo_origin(item)
    if memo is not None:
        lines.append(f"{'':>6}memo hit: answered from session {memo['session']} entry {memo['seq']}; nothing was sent")
    views: dict[str, dict[str, Any]] = {}
    for ref in item.refs():
        if ref in erased:
            views[ref] = {"state": "erased"}
            if payloads:
                lines.append(f"{'':>6}{ref[:19]}...  (erased)")
            continue
        data = store.blob(ref)
        if data is None:
            views[ref] = {"state": "not_stored"}
            continue
        value, preview = _payload_view(data, full=full)
        views[ref] = {"state": "present", "bytes": len(data)}
        if payloads:
            views[ref]["value"] = value
            lines.append(f"{'':>6}{ref[:19]}...  {preview}")
    out = {
        "seq": item.seq,
        "index": item.index,
        "ts": item.ts,
        "kind": item.kind,
        "hash": item.hash,
        "keyid": item.keyid,
        "entry": item.entry,
        "payloads": views,
        **({"memo_hit": memo} if memo is not None else {}),
    }
    return out, lines


def _memo_origin(item: StoredEntry) -> dict[str, Any] | None:
    """Where a memo hit's result came from (``replayed_from`` of an ``mcp_tool_call``), else None."""
    origin: Any = item.body.get("replayed_from") if item.kind == "mcp_tool_call" else None
    if not isinstance(origin, dict):
        return None
    held = cast(dict[str, Any], origin)
    return {"session": str(held.get("session")), "seq": held.get("seq"), "hash": held.get("hash")}


def verify(args: argparse.Namespace, ctx: Ctx) -> int:
    if args.bundle or args.since or (args.checkpoint and not (args.session or args.all)):
        return _verify_evidence(args, ctx)
    if args.session and args.all:
        raise UsageError("truss ledger verify: give SESSION or --all, not both")
    trusted = trusted_from_args(args, ctx)
    policy = read_policy(args)
    notes = read_notes(args)
    with ctx.open_runtime(signing=False) as runtime:
        store = runtime.store
        # The key history in the log's own session is followed from `trusted` (audit.verify does).
        report = audit.verify(store, trusted, session=args.session, payloads=not args.no_payloads)
        witnessed = None
        if report.ok and (policy is not None or notes):
            history = store_history(store, trusted)
            if isinstance(history, VerifyReport):
                return _render_report(ctx, history, scope=args.session or "all")
            witnessed = policy_for_store(store, policy, history, args.session, notes)
    if witnessed is not None and not witnessed.ok:
        return render_policy_failure(ctx, witnessed, {"scope": args.session or "all", **report.to_json(), "ok": False})
    return _render_report(ctx, report, scope=args.session or "all", witnessed=witnessed)


def _render_report(ctx: Ctx, report: VerifyReport, *, scope: str, witnessed: PolicyReport | None = None) -> int:
    data = {"scope": scope, **report.to_json()}
    what = f"session {scope}" if scope != "all" else "the whole log"
    if report.ok:
        human = (
            f"verified {what}: {report.entries} entries in {report.sessions} session(s); signatures, hash chains, "
            f"log indexes; {report.blobs_checked} stored payload(s) re-hashed ({report.blobs_absent} other hash "
            "reference(s), such as pins, digests or erased payloads, have no stored bytes to check)"
        )
        if witnessed is not None:
            data["policy"] = witnessed.to_json()
            human += "\n" + _witnessed_line(witnessed)
        ctx.emit(data, human)
        return 0
    ctx.emit(data, f"NOT VERIFIED ({report.reason}): {report.message}")
    if not ctx.json:
        ctx.progress(
            "truss: do not trust this record; compare it with an exported bundle or a checkpoint you hold "
            "(docs/ledger-format.md lists the reasons)"
        )
    return 1


def _witnessed_line(witnessed: PolicyReport) -> str:
    required = witnessed.required
    checked = f"{len(witnessed.checked)} signed checkpoint(s) agree with each other and with the log"
    if required is None:
        return checked
    who = ", ".join(sorted(required.cosignatures)) or "no witness needed"
    return f"witnessed: the checkpoint of size {required.checkpoint.size} meets the quorum ({who}); {checked}"


def erase(args: argparse.Namespace, ctx: Ctx) -> int:
    if not args.payloads:
        raise UsageError(
            "truss ledger erase: say what to erase with --payloads",
            remedy="run `truss ledger erase SESSION --payloads`",
        )
    with ctx.open_runtime(signing=False) as runtime:
        _require_session(runtime.store, args.session)
        count = runtime.store.erase_payloads(args.session)
    ctx.emit(
        {"session": args.session, "erased": count},
        f"erased {count} payload(s) of session {args.session}; its entries and their hashes remain and still verify",
    )
    return 0


def sweep_payloads(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.contract import Harness, keep_ms, load_operator_harness
    from truss.retention import sweep

    if args.keep is not None:
        try:
            harness = Harness.model_validate({"keep": args.keep})
        except ValueError:
            raise UsageError(
                f"--keep {args.keep!r} is not a duration",
                remedy='Give a duration such as "90d" or "12h", or "forever"',
            ) from None
    else:
        harness = load_operator_harness(ctx.home)
    keep = keep_ms(harness)
    with ctx.open_runtime(signing=False) as runtime:
        report = sweep(runtime.store, keep_ms=keep, now_ms=runtime.clock.now_ms(), dry_run=args.dry_run)
    if keep is None:
        text = 'retention is "forever" ([harness] keep): nothing swept'
    else:
        verb = "would erase" if args.dry_run else "erased"
        cutoff = _time(report.cutoff_ms or 0)
        lines = [f"{verb} the payloads of {len(report.swept)} session(s) ended before {cutoff} UTC"]
        lines += [f"  {s}: {n} payload(s)" if not args.dry_run else f"  {s}" for s, n in sorted(report.swept.items())]
        kept = len(report.unfinished) + len(report.holding_quota)
        lines.append(
            f"kept: {kept} unfinished or quota-holding, {report.recent} recent, {report.already} already swept"
        )
        text = "\n".join(lines)
    ctx.emit({**report.to_json(), "dry_run": args.dry_run}, text)
    return 0


# -- the log: checkpoints, bundles, verdicts, --since (engineer C) -------------------------------


def _add_verify_log_args(verify_parser: argparse.ArgumentParser) -> None:
    verify_parser.add_argument(
        "--bundle",
        metavar="FILE",
        help="verify an exported bundle offline instead of this home's ledger (with --trusted-key)",
    )
    verify_parser.add_argument(
        "--since",
        metavar="FILE",
        help="prove the current log extends the signed checkpoint in FILE (one you kept earlier)",
    )
    add_policy_args(verify_parser)


def _add_export(commands: Any) -> None:
    p = commands.add_parser(
        "export",
        help=_HELP["export"],
        description="Write SESSION's entries, payloads (unless --no-payloads), verdict envelope, a signed "
        "checkpoint, inclusion proofs and the log's verifier key as one JSON file. Anyone holding the "
        "verifier key checks it with `truss ledger verify --bundle FILE --trusted-key VKEY`.",
    )
    p.add_argument("session", metavar="SESSION")
    p.add_argument("-o", "--output", metavar="FILE", help="write here (default: standard output)")
    p.add_argument("--no-payloads", action="store_true", help="leave argument and result bytes out")
    from truss_cli import _ledger_otlp  # --format otlp-json (docs/telemetry.md), kept in its own module

    _ledger_otlp.register(p, bundle=export_session, add_trusted_key_arg=add_trusted_key_arg,
                          trusted_from_args=trusted_from_args, open_readonly=_open_readonly,
                          write_file=_write_file)  # fmt: skip
    LEDGER_PARSERS["export"] = p


def _add_checkpoint(commands: Any) -> None:
    p = commands.add_parser(
        "checkpoint",
        help=_HELP["checkpoint"],
        description="Sign a C2SP checkpoint (origin, size, root) of the whole log with the identity key, "
        "after proving it extends the last one signed. Keep the printed note: `truss ledger verify --since "
        "FILE` later proves the log was not rewritten since.",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="also write the signed note here")
    p.add_argument(
        "--witness",
        action="store_true",
        help="also submit it to the witnesses of HOME/witness.toml now (no throttle) and keep their "
        "cosignatures; exit 4 when the quorum is not met (run it again later)",
    )
    p.add_argument(
        "--every",
        metavar="DURATION",
        help="keep running: sign a checkpoint whenever the log grew, at most once per DURATION (1s, 250ms), "
        "until SIGTERM or Ctrl-C; the publisher workers' sessions wait for (docs/postgresql.md)",
    )
    p.set_defaults(handler=checkpoint_log)
    LEDGER_PARSERS["checkpoint"] = p


def _add_verdict(commands: Any) -> None:
    p = commands.add_parser(
        "verdict",
        help=_HELP["verdict"],
        description="Print SESSION's DSSE verdict envelope (an in-toto statement) after checking its "
        "signature against the trusted keys and that it names the session's recorded head.",
    )
    p.add_argument("session", metavar="SESSION")
    add_trusted_key_arg(p)
    p.set_defaults(handler=show_verdict)
    LEDGER_PARSERS["verdict"] = p


_BUILDERS: dict[str, Callable[[Any], None]] = {
    "list": _add_list,
    "show": _add_show,
    "verify": _add_verify,
    "erase": _add_erase,
    "sweep": _add_sweep,
    "export": _add_export,
    "checkpoint": _add_checkpoint,
    "verdict": _add_verdict,
    "report": functools.partial(_add_report_or_why, name="report"),
    "why": functools.partial(_add_report_or_why, name="why"),
    "migrate": _add_migrate,
    "keys": _add_keys,
}


def _write_file(path: Path, data: bytes) -> None:
    # All or nothing: a reader never sees half a bundle, and a failed write leaves no file.
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"cannot write {path}: {exc.strerror}", remedy="choose a writable path") from exc


def _read_input(path_text: str, what: str, limit: int) -> bytes:
    path = Path(path_text)
    try:
        size = path.stat().st_size
        if size > limit:
            raise BundleFormatError(f"{path}: {size} bytes is more than a {what} may hold ({limit})", file=str(path))
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read the {what} {path}: {exc.strerror}", remedy="check the path") from exc


def export_session(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.ledger.bundle import export_bundle

    with ctx.open_runtime() as runtime:
        key = runtime.signer
        data = export_bundle(
            runtime.store, args.session, vkey=key.verifier.vkey, payloads=not args.no_payloads, signer=key
        )
    if args.output is None:
        sys.stdout.buffer.write(data + b"\n")
        sys.stdout.buffer.flush()
        return 0
    _write_file(Path(args.output), data + b"\n")
    ctx.emit(
        {"session": args.session, "file": args.output, "bytes": len(data) + 1, "payloads": not args.no_payloads},
        f"wrote the bundle of session {args.session} to {args.output} ({len(data) + 1} bytes); verify it with\n"
        f"  truss ledger verify --bundle {args.output} --trusted-key '{trust_root(ctx.key)[0].vkey}'",
    )
    return 0


def checkpoint_log(args: argparse.Namespace, ctx: Ctx) -> int:
    if args.every is not None:
        if args.witness or args.output:
            raise UsageError("--every runs the publisher; it takes no --witness or --output", remedy="drop them")
        from truss_cli._ledger_keys import publish_checkpoints

        return publish_checkpoints(ctx, args.every)
    settings = _witness_settings(ctx) if args.witness else None
    with ctx.open_runtime() as runtime:
        store = runtime.store
        cp = end_checkpoint(store, runtime.signer)  # a worker key gets the log key's, waiting for the publisher
        assert cp.note is not None
        note = cp.note.decode("utf-8")
        witnessed = None
        if settings is not None:
            from truss.witness.submit import witness_checkpoint

            note_bytes = cp.note

            async def submit() -> Any:
                return await witness_checkpoint(store, note_bytes, settings, ctx.clock, throttle=False)

            import anyio

            witnessed = anyio.run(submit)
            note = witnessed.note
    if args.output:
        _write_file(Path(args.output), note.encode("utf-8"))
    data: dict[str, Any] = {
        "origin": cp.origin,
        "size": cp.size,
        "root": base64.b64encode(cp.root).decode("ascii"),
        "note": note,
    }
    if witnessed is None:
        ctx.emit(data, note.rstrip("\n"))
        return 0
    data["witness"] = witnessed.to_json()
    lines = [note.rstrip("\n"), ""]
    lines += [f"{o.witness:<12} {o.outcome:<12} {o.reason}  {o.detail}".rstrip() for o in witnessed.outcomes]
    lines.append(witnessed.summary())
    ctx.emit(data, "\n".join(lines))
    if witnessed.witnessed:
        return 0
    if not ctx.json:
        ctx.progress(
            "truss: the checkpoint is signed and kept, but not yet witnessed to the quorum; "
            "run `truss ledger checkpoint --witness` again later"
        )
    return WitnessError.exit_code


def _witness_settings(ctx: Ctx) -> Any:
    from truss.witness.config import CONFIG_NAME, load_settings

    settings = load_settings(ctx.home)
    if settings is None:
        raise UsageError(
            f"truss ledger checkpoint --witness: this home has no {CONFIG_NAME}",
            remedy=f"write {ctx.home / CONFIG_NAME} naming a tlog-policy file with the witnesses (docs/witness.md)",
        )
    return settings


def _verify_evidence(args: argparse.Namespace, ctx: Ctx) -> int:
    if args.bundle and (args.since or args.session or args.all):
        raise UsageError("truss ledger verify: --bundle checks a file on its own; give no SESSION, --all or --since")
    trusted = trusted_from_args(args, ctx)
    policy = read_policy(args)
    notes = read_notes(args)
    if not args.bundle and not args.since:
        witnessed = policy_for_notes(trusted, policy, notes)
        if not witnessed.ok:
            return render_policy_failure(ctx, witnessed, {"ok": False})
        ctx.emit({"ok": True, "policy": witnessed.to_json()}, _witnessed_line(witnessed))
        return 0
    if args.bundle:
        from truss.ledger.bundle import MAX_BUNDLE_BYTES

        data = _read_input(args.bundle, "bundle", MAX_BUNDLE_BYTES)
        report = audit.verify(data, trusted)
        if report.ok and (policy is not None or notes):
            witnessed = policy_for_bundle(data, trusted, policy, notes)
            if not witnessed.ok:
                return render_policy_failure(ctx, witnessed, {**report.to_json(), "ok": False})
            human = (
                f"verified bundle of session {report.session}: {report.entries} entries, each proven in the "
                f"checkpoint of size {report.checkpoint_size}; verdict {report.verdict or 'none'}\n"
                + _witnessed_line(witnessed)
            )
            ctx.emit({**report.to_json(), "policy": witnessed.to_json()}, human)
            return 0
        if report.ok:
            human = (
                f"verified bundle of session {report.session}: {report.entries} entries, each proven in the "
                f"checkpoint of size {report.checkpoint_size}; verdict {report.verdict or 'none'}; "
                f"head {(report.head or '')[:16]}; {report.blobs_checked} payload(s) checked, "
                f"{report.blobs_absent} not included"
            )
            ctx.emit(report.to_json(), human)
            return 0
        ctx.emit(report.to_json(), f"NOT VERIFIED at {report.step} ({report.reason}): {report.message}")
        return report.exit_code
    note = _read_input(args.since, "checkpoint", MAX_NOTE_BYTES)
    with ctx.open_runtime(signing=False) as runtime:
        history = store_history(runtime.store, trusted)
        if isinstance(history, VerifyReport):
            return _render_report(ctx, history, scope="all")
        since = audit.verify_since(runtime.store, note, history)
    if since.ok:
        ctx.emit(
            since.to_json(),
            f"the log extends the checkpoint of size {since.old_size}: it now holds {since.size} entries "
            f"and nothing before entry {since.old_size} was changed",
        )
        return 0
    ctx.emit(since.to_json(), f"NOT VERIFIED ({since.reason}): {since.message}")
    return since.exit_code


def show_verdict(args: argparse.Namespace, ctx: Ctx) -> int:
    trusted = trusted_from_args(args, ctx)
    with ctx.open_runtime(signing=False) as runtime:
        store = runtime.store
        info = _require_session(store, args.session)
        raw = store.envelope(args.session)
        history = store_history(store, trusted)
        if isinstance(history, VerifyReport):
            return _render_report(ctx, history, scope=args.session)
        verdict: VerdictStatement | None = None
        if raw is not None:
            # The trusted keys given here, not only the runtime's (R4); after a rotation, a key
            # that signs at the session's last entry (B7).
            at = functools.partial(audit.head_index, unverified(store), args.session, int(info.entries), info.head)
            verdict = history.open_verdict(raw, session=args.session, head=info.head, head_index=at)
    if raw is None or verdict is None:
        raise NotFoundError(
            f"session {args.session} has no verdict envelope",
            remedy="a verdict is issued when a run ends; see `truss ledger show` for where it stopped",
            what="verdict",
            name=args.session,
        )
    envelope = parse_envelope(raw).to_json()
    ctx.emit(
        {"session": args.session, "verified": True, "envelope": envelope, "statement": verdict.statement},
        json.dumps(envelope, indent=2)
        + f"\nverified: verdict {verdict.status} for session {args.session}, head {verdict.head[:16]}, "
        f"signed by a trusted key",
    )
    return 0
