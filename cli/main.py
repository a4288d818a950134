"""Entry point: global options, the command table, and the one error handler.

Exit codes (docs/cli.md): 0 ok/pass, 1 verdict fail or verification failure, 2 bad input,
3 suspended or waiting, 4 runtime error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, cast

from truss_cli._term import safe_human

from truss._errors import TrussError, UsageError

if TYPE_CHECKING:  # Ctx (dataclasses, json) and traceback load only once a command runs or fails
    from truss_cli._ctx import Ctx


def _command_modules() -> list[str]:
    """Every ``truss_cli.cmd_*`` module, in name order. Each has ``register(subparsers)`` and sets
    ``handler`` on its parsers; none may import the MCP SDK at import time."""
    import pkgutil

    import truss_cli

    return sorted(f"truss_cli.{m.name}" for m in pkgutil.iter_modules(truss_cli.__path__) if m.name.startswith("cmd_"))


# The top-level commands in the order ``build_parser`` registers them: (name, module, help). ``truss
# --help`` and a command's own parse read this table, so starting the CLI imports only the chosen
# command's module (tests/cli/test_basics.py checks the table against every module's ``register``).
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("contract", "cmd_contract", "check a contract or show its effective form"),
    ("replay", "cmd_durable", "re-derive a finished session from its ledger alone and recompute its verdict"),
    ("resolve", "cmd_durable", "answer an in-doubt call (sent, but its result never recorded)"),
    ("signal", "cmd_durable", "deliver the result a pending async call waits for"),
    ("init", "cmd_init", "create the Truss home and its identity key (idempotent)"),
    ("key", "cmd_key", "the identity key that signs this home's ledger"),
    ("ledger", "cmd_ledger", "list, show, verify, export, checkpoint and prune the signed ledger"),
    ("mcp", "cmd_mcp", "list, probe and import MCP servers"),
    ("run", "cmd_run", "run a contract: every tool call through the gate, ending in a signed verdict"),
    ("resume", "cmd_run", "continue a suspended or interrupted session"),
    ("approve", "cmd_run", "approve (or --deny) a call waiting for approval"),
    ("sessions", "cmd_run", "list sessions with their status"),
    ("serve-mcp", "cmd_serve", "serve contracts to other harnesses over MCP (stdio or Streamable HTTP)"),
    ("status", "cmd_status", "unfinished sessions (with the command that moves each on) and every quota's use"),
    ("witness", "cmd_witness", "run a C2SP witness that cosigns other logs' checkpoints (init, serve, show)"),
)

Handler = Callable[[argparse.Namespace, "Ctx"], int]


def _columns() -> int:
    """The terminal's width as ``shutil.get_terminal_size`` gives it (``COLUMNS``, then stdout's
    terminal, then 80), without importing ``shutil`` (and with it ``bz2`` and ``lzma``): argparse
    builds a help formatter for every argument it adds, and its own asks ``shutil``."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns if sys.__stdout__ else 0
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Formatter(argparse.HelpFormatter):
    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None
    ) -> None:
        super().__init__(prog, indent_increment, max_help_position, _columns() - 2 if width is None else width)


class _Parser(argparse.ArgumentParser):
    """argparse that raises ``UsageError`` instead of printing usage and exiting by itself, and formats
    help without loading ``shutil`` (``_Formatter``; every parser made under it is a ``_Parser``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}", remedy=f"See '{self.prog} --help'")


class _LazyParser(_Parser):
    """A top-level command's place in ``truss``'s parser: it holds the name and help the command list
    shows, and only when argparse picks it does it import the command's module, build the real parser
    and hand the rest of the command line to it (so errors and ``--help`` are the real parser's)."""

    def __init__(self, *args: Any, command: str, module: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._command = command
        self._module = module

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        real = _register(_Parser(prog="truss"), [f"truss_cli.{self._module}"], lazy=True).choices[self._command]
        return real.parse_known_args(*args, **kwargs)


def _register(parser: argparse.ArgumentParser, modules: Sequence[str], *, lazy: bool = False) -> Any:
    """Each module's ``register(sub)``; with ``lazy``, its ``register_lazy(sub)`` where it has one (a
    command whose sub-commands' parsers are built only when chosen: ``ledger``)."""
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in modules:
        module: Any = importlib.import_module(name)
        register: Callable[[Any], None] = getattr(module, "register_lazy", module.register) if lazy else module.register
        register(sub)
    return sub


def _top_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="truss",
        description="Run agent contracts with third-party MCP tools through one audited gate.",
        epilog="Exit codes: 0 ok, 1 verdict fail or verification failure, 2 bad input, 3 suspended, 4 runtime error.",
    )
    _add_globals(parser)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The whole parser, every command's module imported (the docs check walks it)."""
    parser = _top_parser()
    _register(parser, _command_modules())
    return parser


def _lazy_parser() -> argparse.ArgumentParser:
    """The parser ``main`` uses: the same commands, each built only if it is the one being run."""
    parser = _top_parser()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_LazyParser)
    for name, module, help_text in COMMANDS:
        sub.add_parser(name, help=help_text, add_help=False, command=name, module=module)  # the real one has -h
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
        parser = _lazy_parser()
        args = parser.parse_args(args_list)
        from truss_cli._ctx import Ctx

        ctx = Ctx.from_options(args.home, args.db, args.key, verbose=args.verbose, json_out=args.json)
        handler: Handler | None = getattr(args, "handler", None)
        if handler is None:
            parser.print_help()
            return 0 if args.command is None else 2
        return handler(args, ctx)
    except TrussError as exc:
        return _report(exc, verbose=verbose, json_out=json_out)
    except KeyboardInterrupt as exc:
        by = f" ({exc})" if str(exc) else ""  # the signal, when the command named it (SIGTERM)
        sys.stderr.write(f"truss: interrupted{by}\n")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # the last line of defence: a paragraph, not a traceback
        if verbose:
            import traceback

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
        import traceback

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
