"""``truss ledger export SESSION --format otlp-json``: a recorded session's spans, after the fact.

``cmd_ledger`` hands over the ``export`` parser, its own bundle handler and its shared helpers
(``register``); this module adds ``--format``, the content flags and ``--trusted-key`` and picks
the handler, so neither imports the other back. The spans are the ones a live run with telemetry
on sends (docs/telemetry.md), built from the ledger alone once the session verifies against the
trusted key(s); their ids are derived from the record, so exporting again gives the same ids.
The document is one OTLP/JSON ``ExportTraceServiceRequest``: POST it to a collector's
``/v1/traces`` with ``Content-Type: application/json``. Exit codes: 0 written, 1 the session does
not verify (nothing written), 2 unknown session or bad flags.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from truss_cli._ctx import Ctx

from truss._errors import UsageError
from truss.ledger.keys import TrustedKeys

__all__ = ["register"]

Handler = Callable[[argparse.Namespace, Ctx], int]


def register(
    parser: argparse.ArgumentParser,
    *,
    bundle: Handler,
    add_trusted_key_arg: Callable[[argparse.ArgumentParser], None],
    trusted_from_args: Callable[[argparse.Namespace, Ctx], TrustedKeys],
    open_readonly: Callable[[Ctx], Any],
    write_file: Callable[[Path, bytes], None],
) -> None:
    """Add ``--format``, ``--arguments``, ``--results`` and ``--trusted-key`` to ``truss ledger export``."""
    parser.add_argument(
        "--format",
        choices=("bundle", "otlp-json"),
        default="bundle",
        help="bundle (default): the offline-verifiable bundle; otlp-json: the session's OpenTelemetry spans "
        "as an OTLP/JSON document (docs/telemetry.md)",
    )
    parser.add_argument(
        "--arguments",
        action="store_true",
        help="otlp-json: put each call's arguments in its span, as the ledger stores them (redacted)",
    )
    parser.add_argument(
        "--results",
        action="store_true",
        help="otlp-json: put each call's result in its span, as the ledger stores it (secrets scrubbed)",
    )
    add_trusted_key_arg(parser)  # otlp-json: the keys the session must verify against
    spans = functools.partial(
        export_spans, trusted_from_args=trusted_from_args, open_readonly=open_readonly, write_file=write_file
    )
    parser.set_defaults(handler=functools.partial(_pick, bundle=bundle, spans=spans))


def _pick(args: argparse.Namespace, ctx: Ctx, *, bundle: Handler, spans: Handler) -> int:
    if args.format == "otlp-json":
        if args.no_payloads:
            raise UsageError(
                "--no-payloads applies to --format bundle; spans hold no payloads unless --arguments or --results"
            )
        return spans(args, ctx)
    if args.arguments or args.results or args.trusted_key:
        raise UsageError(
            "--arguments, --results and --trusted-key apply to --format otlp-json",
            remedy="Add --format otlp-json, or drop them for the bundle (it is verified by whoever receives it)",
        )
    return bundle(args, ctx)


def export_spans(
    args: argparse.Namespace,
    ctx: Ctx,
    *,
    trusted_from_args: Callable[[argparse.Namespace, Ctx], TrustedKeys],
    open_readonly: Callable[[Ctx], Any],
    write_file: Callable[[Path, bytes], None],
) -> int:
    from truss.telemetry import Content, export_session

    trusted = trusted_from_args(args, ctx)
    content = Content(arguments=args.arguments, results=args.results)
    with open_readonly(ctx) as runtime:
        data = export_session(runtime.store, args.session, trusted, content=content)
    if args.output is None:
        sys.stdout.buffer.write(data + b"\n")
        sys.stdout.buffer.flush()
        return 0
    write_file(Path(args.output), data + b"\n")
    ctx.emit(
        {"session": args.session, "file": args.output, "bytes": len(data) + 1, "format": "otlp-json"},
        f"wrote the spans of session {args.session} to {args.output} ({len(data) + 1} bytes, OTLP/JSON); send "
        f"them with\n  curl -H 'Content-Type: application/json' --data-binary @{args.output} "
        "http://COLLECTOR:4318/v1/traces",
    )
    return 0
