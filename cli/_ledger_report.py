"""``truss ledger report`` and ``truss ledger why``: the auditor's page, and one call's decision path.

``cmd_ledger`` registers both under ``ledger`` (``register(commands, helpers)``), handing over the
helpers it shares (trusted keys, the read-only runtime) so this module never imports it back. Thin:
read the session or
the bundle, call ``truss.report``, write or print. The report is always built from a bundle: for a
SESSION, the bundle ``truss ledger export`` would write is made in memory first, so the page checks
exactly what an auditor would be given. ``why`` reads the session through ``_read_session`` alone.

Exit codes: ``report`` 0 written and the bundle verifies, 1 written but the bundle does not verify
(the page shows where), 2 unusable input (nothing written); ``why`` 0, 2 unknown session or call.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from truss_cli._ctx import Ctx

import truss
from truss._errors import BundleFormatError, NotFoundError, UsageError
from truss.ledger.entry import StoredEntry, iter_refs
from truss.ledger.keys import TrustedKeys
from truss.ledger.stores import redact_url

if TYPE_CHECKING:
    from truss.runtime import Runtime

__all__ = ["LedgerHelpers", "register"]


@dataclass(frozen=True)
class LedgerHelpers:
    """What ``cmd_ledger`` shares with these commands (its ``add_trusted_key_arg`` and so on)."""

    add_trusted_key_arg: Callable[[argparse.ArgumentParser], None]
    trusted_from_args: Callable[[argparse.Namespace, Ctx], TrustedKeys]
    open_readonly: Callable[[Ctx], Runtime]


def register(commands: Any, helpers: LedgerHelpers, *, only: str | None = None) -> dict[str, argparse.ArgumentParser]:
    """Add ``report`` and ``why`` (or ``only`` one of them) to the ``ledger`` sub-commands; returns
    their parsers by name."""
    out: dict[str, argparse.ArgumentParser] = {}
    if only in (None, "report"):
        out["report"] = _add_report(commands, helpers)
    if only in (None, "why"):
        out["why"] = _add_why(commands, helpers)
    return out


def _add_report(commands: Any, helpers: LedgerHelpers) -> argparse.ArgumentParser:
    p = commands.add_parser(
        "report",
        help="write a self-contained HTML report of a session that verifies itself in the browser",
        description="Write one HTML file showing SESSION (or the bundle in --bundle FILE): its timeline, each "
        "call's detail and decision path, budget use, the contract in force, the verdict and the checkpoint. "
        "The page embeds the bundle and checks it in the browser, offline, against the trusted key(s); it "
        "loads nothing from anywhere. See docs/report.md.",
    )
    p.add_argument("session", metavar="SESSION", nargs="?", help="a session of this home's ledger")
    p.add_argument("--bundle", metavar="FILE", help="report on an exported bundle instead of a session")
    p.add_argument("-o", "--output", metavar="FILE", required=True, help="the HTML file to write")
    p.add_argument("--no-payloads", action="store_true", help="with SESSION: leave argument and result bytes out")
    helpers.add_trusted_key_arg(p)
    p.set_defaults(handler=functools.partial(write_report, helpers=helpers))
    return p


def _add_why(commands: Any, helpers: LedgerHelpers) -> argparse.ArgumentParser:
    q = commands.add_parser(
        "why",
        help="why one call was allowed, denied, held or replayed, with the entries that record it",
        description="Print the decision path of CALL (a call id such as c2.0, as `truss ledger show` lists) in "
        "SESSION: the allowlist, pin, policy rule, approval, budget and execution path (live, replayed on "
        "resume, cross-run memo, in-doubt resolution, signal, task), each with the seqs of its entries. Steps "
        "marked re-derived are not recorded themselves and are computed from the recorded contract and entries.",
    )
    q.add_argument("session", metavar="SESSION")
    q.add_argument("call", metavar="CALL")
    q.set_defaults(handler=functools.partial(why, helpers=helpers))
    return q


# -- reading -------------------------------------------------------------------------------------


def _read_session(ctx: Ctx, session: str, helpers: LedgerHelpers) -> tuple[list[StoredEntry], dict[str, bytes]]:
    """A session's entries and the payloads it still holds: the one place ``why`` reads the store."""
    with helpers.open_readonly(ctx) as runtime:
        store = runtime.store
        if store.session(session) is None:
            raise NotFoundError(
                f"no session {session!r} in {redact_url(ctx.db)}",
                remedy="list sessions with `truss ledger list`",
                what="session",
                name=session,
            )
        entries: list[StoredEntry] = list(store.read_session(session))
        erased: set[str] = store.erased_refs(session)
        refs = {ref for e in entries for ref in iter_refs(e.body)} - erased
        blobs: dict[str, bytes] = store.blobs_for(refs)
    return entries, blobs


def _read_bundle(path_text: str) -> bytes:
    from truss.ledger.bundle import MAX_BUNDLE_BYTES  # the bundle code loads only for report (start-up)

    path = Path(path_text)
    try:
        size = path.stat().st_size
        if size > MAX_BUNDLE_BYTES:
            raise BundleFormatError(f"{path}: {size} bytes is more than a bundle may hold ({MAX_BUNDLE_BYTES})")
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read the bundle {path}: {exc.strerror}", remedy="check the path") from exc


def _export(ctx: Ctx, session: str, *, payloads: bool) -> bytes:
    from truss.ledger.bundle import export_bundle

    with ctx.open_runtime() as runtime:
        key = runtime.signer
        # As `truss ledger export` does: a session no checkpoint covers yet gets one signed now.
        return export_bundle(runtime.store, session, vkey=key.verifier.vkey, payloads=payloads, signer=key)


def _write(path: Path, data: bytes) -> None:
    # All or nothing: a half-written report never replaces a good one.
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


# -- handlers ------------------------------------------------------------------------------------


def write_report(args: argparse.Namespace, ctx: Ctx, *, helpers: LedgerHelpers) -> int:
    if bool(args.session) == bool(args.bundle):
        raise UsageError(
            "truss ledger report: give SESSION or --bundle FILE (one of them)",
            remedy="Run `truss ledger report SESSION -o report.html` "
            "or `truss ledger report --bundle FILE -o report.html`",
        )
    if args.bundle and args.no_payloads:
        raise UsageError("truss ledger report: --no-payloads applies to SESSION; a bundle is shown as it is")
    from truss.ledger.bundle import verify_bundle

    trusted = helpers.trusted_from_args(args, ctx)
    data = _read_bundle(args.bundle) if args.bundle else _export(ctx, args.session, payloads=not args.no_payloads)
    checked = verify_bundle(data, trusted)
    if checked.exit_code == 2:
        raise BundleFormatError(
            f"the bundle cannot be read ({checked.step} {checked.reason}): {checked.message}; no report was written",
            remedy="obtain the bundle again from its source",
            step=checked.step,
            reason=checked.reason,
        )
    from truss.report.page import build_report

    page = build_report(data, [k.vkey for k in trusted], truss_version=truss.__version__)
    output = Path(args.output)
    _write(output, page.data)
    summary = {
        "file": str(output),
        "bytes": len(page.data),
        "session": checked.session,
        "verified": checked.ok,
        "trusted": [k.vkey for k in trusted],
        "verification": checked.to_json(),
    }
    head = f"wrote the report of session {checked.session} to {output} ({len(page.data)} bytes)"
    if checked.ok:
        ctx.emit(summary, f"{head}; the bundle verifies under the trusted key(s), and the page checks it again")
        return 0
    where = f" at seq {checked.seq}" if checked.seq is not None else ""
    ctx.emit(
        summary,
        f"{head}; the bundle does NOT verify{where} ({checked.step} {checked.reason}): {checked.message}. "
        "The page shows where.",
    )
    return 1


def why(args: argparse.Namespace, ctx: Ctx, *, helpers: LedgerHelpers) -> int:
    entries, blobs = _read_session(ctx, args.session, helpers)
    from truss.report.why import call_ids, explain_call  # the contract models: only for this command

    explanation = explain_call(entries, blobs.get, args.call)
    if explanation is None:
        known = call_ids(entries)
        listed = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
        raise NotFoundError(
            f"session {args.session} has no call {args.call!r}",
            remedy=f"Its calls are: {listed}" if known else "This session made no tool calls",
            what="call",
            name=args.call,
        )
    lines = explanation.lines()
    lines.append(f"(read from the store as recorded; `truss ledger verify {args.session}` checks the entries)")
    ctx.emit(explanation.to_json(), "\n".join(lines))
    return 0
