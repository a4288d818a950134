"""Entry point: global options, the command table, and the one error handler.

Exit codes (docs/cli.md): 0 ok/pass, 1 verdict fail or verification failure, 2 bad input,
3 suspended or waiting, 4 runtime error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, cast

from truss_cli._ctx import Ctx
from truss_cli._term import safe_human

from truss._errors import TrussError, UsageError


def _command_modules() -> list[str]:
    """Every ``truss_cli.cmd_*`` module, in name order. Each has ``register(subparsers)`` and sets
    ``handler`` on its parsers; none may import the MCP SDK at import time."""
    import pkgutil

    import truss_cli

    return sorted(f"truss_cli.{m.name}" for m in pkgutil.iter_modules(truss_cli.__path__) if m.name.startswith("cmd_"))


Handler = Callable[[argparse.Namespace, Ctx], int]


class _Parser(argparse.ArgumentParser):
    """argparse that raises ``UsageError`` instead of printing usage and exiting by itself."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}", remedy=f"See '{self.prog} --help'")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="truss",
        description="Run agent contracts with third-party MCP tools through one audited gate.",
        epilog="Exit codes: 0 ok, 1 verdict fail or verification failure, 2 bad input, 3 suspended, 4 runtime error.",
    )
    _add_globals(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in _command_modules():
        module: Any = importlib.import_module(name)
        module.register(sub)
    return parser


def _add_globals(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", help="Truss home (default: $TRUSS_HOME, else ./.truss)")
    parser.add_argument("--db", help="ledger: a path or a URL: sqlite:///PATH, memory: (default: HOME/ledger.db)")
    parser.add_argument("--key", help="identity key (default: HOME/identity.key)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks and server stderr")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    from truss import __version__

    parser.add_argument(
        "--version", action="version", version=f"truss {__version__}", help="print the version and exit"
    )


def _split_globals(argv: list[str]) -> list[str]:
    """Let global options appear after the command too (``truss ledger verify --json``)."""
    flags = {"-v", "--verbose", "--json"}
    valued = {"--home", "--db", "--key"}
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        if arg in flags:
            front.append(arg)
        elif arg in valued and i + 1 < len(argv):
            front.extend(argv[i : i + 2])
            i += 1
        elif any(arg.startswith(v + "=") for v in valued):
            front.append(arg)
        else:
            rest.append(arg)
        i += 1
    return front + rest


def main(argv: Sequence[str] | None = None) -> int:
    args_list = _split_globals(list(sys.argv[1:] if argv is None else argv))
    verbose = "-v" in args_list or "--verbose" in args_list
    json_out = "--json" in args_list
    try:
        parser = build_parser()
        args = parser.parse_args(args_list)
        ctx = Ctx.from_options(args.home, args.db, args.key, verbose=args.verbose, json_out=args.json)
        handler: Handler | None = getattr(args, "handler", None)
        if handler is None:
            parser.print_help()
            return 0 if args.command is None else 2
        return handler(args, ctx)
    except TrussError as exc:
        return _report(exc, verbose=verbose, json_out=json_out)
    except KeyboardInterrupt:
        sys.stderr.write("truss: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # the last line of defence: a paragraph, not a traceback
        if verbose:
            sys.stderr.write(safe_human(traceback.format_exc()))
        sys.stderr.write(
            f"truss: internal error: {type(exc).__name__}: {safe_human(str(exc))}. This is a bug in Truss; "
            "rerun with --verbose for the traceback and report it. Recorded data is not affected: "
            "every ledger write is a committed transaction or nothing.\n"
        )
        return 4


def _report(exc: TrussError, *, verbose: bool, json_out: bool) -> int:
    from truss.redaction import scrub_secrets  # tokens Truss learned while running (OAuth) never show

    if verbose:
        sys.stderr.write(safe_human(scrub_secrets(traceback.format_exc())))
    if json_out:
        import json

        sys.stdout.write(scrub_secrets(json.dumps(exc.to_json(), indent=2)) + "\n")
    text = safe_human(scrub_secrets(exc.diagnostics()))  # messages may quote a server or a model: no escapes
    changes: Any = exc.fields.get("changes")  # a pin mismatch: what changed since the pinned definition
    if isinstance(changes, list) and changes:
        text += "\n" + "\n".join("  " + safe_human(scrub_secrets(str(line))) for line in cast(list[Any], changes))
    sys.stderr.write(text + "\n" if text.startswith("truss") else f"truss: {text}\n")
    return exc.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
