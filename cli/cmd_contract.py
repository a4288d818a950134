"""``truss contract check|show``: validate a contract with its layers, or print the effective one.

Also the home of the contract flags every command that loads a contract shares (``truss run``,
``truss mcp list``): ``add_contract_args(parser)`` and ``load_from_args(args, ctx)``, so that each
command takes the same ``--param``, ``--agent`` and ``--mcp-config`` and layers them the same way.
Nothing here imports the MCP SDK.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w
from truss_cli._ctx import Ctx

if TYPE_CHECKING:  # the contract models (pydantic) load only in the commands that read a contract
    from truss.contract import Contract


def add_contract_args(parser: argparse.ArgumentParser, *, positional: bool = True) -> None:
    """Add ``CONTRACT`` (when ``positional``), ``--param K=V`` (repeatable), ``--agent F``, ``--mcp-config F``."""
    if positional:
        parser.add_argument("contract", metavar="CONTRACT", help="the contract TOML file")
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a value for one of the contract's [contract.params] (repeatable)",
    )
    parser.add_argument("--agent", metavar="FILE", help="an [agent] table layered under the contract")
    parser.add_argument(
        "--mcp-config", metavar="FILE", help="an overlay of [[mcp.servers]] refining the contract's servers"
    )


def load_from_args(
    args: argparse.Namespace, ctx: Ctx, *, environ: Mapping[str, str] | None = None, require_params: bool = True
) -> Contract:
    """The effective contract named by ``args.contract`` with the flags of ``add_contract_args``.

    The operator config is ``ctx.home / "config.toml"`` when it exists. Pass ``environ`` (commands
    that run) to require every ``${env.X}`` the contract uses to be set; ``check`` and ``show``
    do not, so a contract can be checked where its variables are not set.
    """
    from truss.contract import load_contract

    return load_contract(
        Path(args.contract),
        home=ctx.home,
        agent_file=args.agent,
        overlay=args.mcp_config,
        param_args=list(args.param or []),
        environ=environ,
        require_params=require_params,
    )


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("contract", help="check a contract or show its effective form")
    commands = parser.add_subparsers(dest="contract_command", metavar="SUBCOMMAND")
    check = commands.add_parser("check", help="validate a contract with its layers (exit 0 valid, 2 invalid)")
    add_contract_args(check)
    check.set_defaults(handler=run_check)
    show = commands.add_parser("show", help="print the effective contract as TOML and its hash")
    add_contract_args(show)
    show.set_defaults(handler=run_show)


def run_check(args: argparse.Namespace, ctx: Ctx) -> int:
    contract = load_from_args(args, ctx)
    servers = ", ".join(s.name for s in contract.mcp.servers) or "none"
    # Valid but probably unintended policies are warnings: they never change the exit code.
    from truss.policy import lint

    warnings = [{"path": f.path, "message": f.message} for f in lint(contract)]
    if not contract.done.checks and contract.done.pass_without_checks is None:
        warnings.append(
            {
                "path": "done.checks",
                "message": "the contract has no done checks, so a run passes only when a call succeeded and none "
                "was denied; add [[done.checks]] that say what done means, or set [done] pass_without_checks",
            }
        )
    if not ctx.json:
        for warning in warnings:
            ctx.progress(f"truss: warning: {args.contract} at {warning['path']}: {warning['message']}")
    ctx.emit(
        {
            "ok": True,
            "file": args.contract,
            "name": contract.contract.name,
            "hash": contract.hash,
            "warnings": warnings,
        },
        f"ok: {args.contract}: contract {contract.contract.name!r}, servers: {servers}\nhash: {contract.hash}",
    )
    return 0


def run_show(args: argparse.Namespace, ctx: Ctx) -> int:
    contract = load_from_args(args, ctx)
    data = contract.to_json()
    human = f"# effective contract of {args.contract}\n# hash: {contract.hash}\n\n" + tomli_w.dumps(data)
    ctx.emit({"hash": contract.hash, "contract": data}, human)
    return 0
