"""``truss serve-mcp``: let another harness delegate contracts to Truss over MCP (docs/serve-mcp.md).

Thin: parse the options, open the home's runtime (key and ledger, ``Ctx.open_runtime``), and hand
over to ``truss.mcp`` (imported only when the command runs, so ``truss --help`` stays fast).
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from truss_cli._ctx import Ctx
from truss_cli._telemetry import close_telemetry, open_telemetry

from truss._errors import UsageError

if TYPE_CHECKING:
    pass


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve-mcp",
        help="serve contracts to other harnesses over MCP (stdio or Streamable HTTP)",
        description=(
            "Advertise four MCP tools (truss_run_contract, truss_contract_status, truss_ledger_verdict, "
            "truss_ledger_export) so another harness can delegate a contract from --contracts-dir and "
            "get back the signed verdict and its evidence."
        ),
    )
    p.add_argument("--contracts-dir", required=True, help="directory of the contracts callers may run, by name")
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio", help="default: stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="HTTP port (default 0: a free port, printed on stderr)")
    p.add_argument("--tokens", help="HTTP: TOML file of sha256-hashed bearer tokens mapped to principals")
    p.add_argument("--principal-tenant", default="local", help="stdio: the tenant of this process's caller")
    p.add_argument("--principal-user", default="local", help="stdio: the user of this process's caller")
    p.add_argument(
        "--unsafe-no-auth",
        action="store_true",
        help="HTTP on a loopback address without tokens: every caller is the --principal-* principal (testing only)",
    )
    p.add_argument("--max-concurrent-runs", type=int, default=4, help="runs at once; beyond: 'busy' (default 4)")
    p.add_argument("--max-request-bytes", type=int, default=1_048_576, help="largest request (default 1 MiB)")
    p.add_argument("--max-answer-bytes", type=int, default=262_144, help="largest inlined export; larger is referenced")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, ctx: Ctx) -> int:
    import logging

    from truss.ledger.keys import IdentityKey
    from truss.mcp._serve_core import Principal, ServeLimits, TokenTable

    for option, value, low in (
        ("--max-concurrent-runs", args.max_concurrent_runs, 1),
        ("--max-request-bytes", args.max_request_bytes, 1024),
        ("--max-answer-bytes", args.max_answer_bytes, 1024),
    ):
        if value < low:
            raise UsageError(f"{option} must be at least {low}", remedy="See 'truss serve-mcp --help'")
    contracts_dir = Path(args.contracts_dir)
    if not contracts_dir.is_dir():
        raise UsageError(f"--contracts-dir {contracts_dir} is not a directory", remedy="Give the contracts directory")
    principal = Principal(args.principal_tenant, args.principal_user)
    tokens: TokenTable | None = None
    if args.transport == "http":
        if args.tokens:
            tokens = TokenTable.load(Path(args.tokens))
        elif not args.unsafe_no_auth:
            raise UsageError(
                "HTTP needs --tokens FILE (sha256 hashes of bearer tokens mapped to principals)",
                remedy="See docs/serve-mcp.md; --unsafe-no-auth exists only for loopback testing",
            )
        if args.unsafe_no_auth and not _loopback(args.host):
            raise UsageError(
                f"--unsafe-no-auth is refused on {args.host}: it is only for a loopback address",
                remedy="Use --tokens FILE",
            )
        if not 0 <= args.port <= 65535:
            raise UsageError(f"--port {args.port} is not a port number", remedy="Use 0-65535")
    elif args.tokens or args.unsafe_no_auth:
        raise UsageError("--tokens and --unsafe-no-auth apply to --transport http", remedy="Drop them for stdio")

    IdentityKey.load(ctx.key)  # a missing or unsafe key is refused before the SDK loads

    # Everything above checks the options without the MCP SDK, so a mistake is reported at once.
    import anyio
    from truss_cli.cmd_run import protected_paths

    from truss.mcp._serve_backend import LedgerBackend
    from truss.mcp._serve_http import serve_http
    from truss.mcp._serve_stdio import serve_stdio
    from truss.mcp.client import connect
    from truss.mcp.server import ServeConfig

    logging.basicConfig(level=logging.INFO if ctx.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if not ctx.verbose:
        for name in ("mcp", "uvicorn", "httpx2", "sse_starlette"):
            logging.getLogger(name).setLevel(logging.ERROR)
    protected = protected_paths(ctx)  # the home, key and ledger files: never visible inside a sandbox

    def connector(contract: Any, **kwargs: Any) -> Any:
        return connect(contract, protected=protected, **kwargs)

    with ctx.open_runtime(create=True, connector=connector) as opened:
        telemetry = open_telemetry(ctx, opened.environ, opened.store)
        try:
            # Every delegated run's spans, beside its progress: the exporter is one more subscriber.
            watching = (telemetry,) if telemetry is not None else ()
            backend = LedgerBackend(dataclasses.replace(opened, events=(*opened.events, *watching)))
            limits = ServeLimits(
                max_request_bytes=args.max_request_bytes,
                max_answer_bytes=args.max_answer_bytes,
                max_concurrent_runs=args.max_concurrent_runs,
            )
            config = ServeConfig(
                contracts_dir=contracts_dir,
                home=ctx.home,
                backend=backend,
                clock=ctx.clock,
                limits=limits,
                sweep=_retention(ctx, opened.store),
            )
            if args.transport == "stdio":
                anyio.run(serve_stdio, config, principal)
            else:
                fixed = principal if args.unsafe_no_auth and tokens is None else None

                async def main() -> None:
                    await serve_http(config, host=args.host, port=args.port, tokens=tokens, fixed_principal=fixed)

                anyio.run(main)
        finally:
            close_telemetry(ctx, telemetry)
    return 0


def _retention(ctx: Ctx, store: Any) -> Any:
    """serve-mcp's retention sweep ([harness] keep, read at start), or None when keep is "forever"."""
    from truss.contract import keep_ms, load_operator_harness
    from truss.mcp.server import say
    from truss.retention import sweep

    keep = keep_ms(load_operator_harness(ctx.home))
    if keep is None:
        return None

    def run() -> None:
        report = sweep(store, keep_ms=keep, now_ms=ctx.clock.now_ms())
        if report.swept:
            say(f"truss serve-mcp: retention erased the payloads of {len(report.swept)} session(s)")

    return run


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
