"""Loading a contract: its layers merged, validated against the models and registries, located errors.

``load_contract`` reads the files and ``load_contract_text`` does the rest over their texts:
parse each layer (``truss.contract.layers``), merge them into the effective data, validate it
against the models (every pydantic error becomes one ``ContractError`` with the file, key path and
line: ``truss.contract.validation``), check the ``${...}`` references
(``truss.contract.substitution``) and the operator's ``[harness]`` limits, decide each stdio
server's sandbox (``truss.contract.sandbox``), fill in the params
(``truss.contract.params``) and check that the result has a canonical form to hash. The provider
kinds and done-check kinds the contract may name come from registries (default
``PROVIDER_KINDS`` and ``DONE_CHECKS``); a name that is not registered is refused here, with its
key path, never treated as something else.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from truss._errors import ContractError, UsageError
from truss._registry import Registry
from truss._suggest import closest
from truss.contract.checks import CONTEXT_KEY as CHECKS_KEY
from truss.contract.checks import DONE_CHECKS, CheckKind
from truss.contract.hashing import contract_hash
from truss.contract.layers import Layer, error_in, merge_layers, parse_layer, read_toml_file, servers_of
from truss.contract.locating import KeyPath
from truss.contract.models import Contract
from truss.contract.params import param_values, parse_param_args
from truss.contract.providers import CONTEXT_KEY as PROVIDERS_KEY
from truss.contract.providers import PROVIDER_KINDS, ProviderKind
from truss.contract.sandbox import OperatorTables, Sandbox, effective_sandbox
from truss.contract.substitution import check_templates, env_refs
from truss.contract.validation import from_validation
from truss.ledger.canonical import CanonicalError

__all__ = ["load_contract", "load_contract_text", "validation_context"]


def _check_harness(contract: Contract, layers: list[Layer], effective: dict[str, Any]) -> None:
    harness = contract.harness
    for i, server in enumerate(contract.mcp.servers):
        if (
            server.transport == "stdio"
            and harness.allow_commands is not None
            and server.command not in harness.allow_commands
        ):
            raise error_in(
                layers,
                effective,
                ("mcp", "servers", i, "command"),
                f"server {server.name!r}: command {server.command!r} is not in the operator's [harness] allow_commands",
                remedy="Use an allowed command, or ask the operator to add it to allow_commands",
                server=server.name,
            )
        if server.transport == "http" and harness.allow_hosts is not None and server.url:
            host = (urlsplit(server.url).hostname or "").lower()
            if not any(fnmatch.fnmatchcase(host, pattern.lower()) for pattern in harness.allow_hosts):
                raise error_in(
                    layers,
                    effective,
                    ("mcp", "servers", i, "url"),
                    f"server {server.name!r}: host {host!r} is not in the operator's [harness] allow_hosts",
                    remedy="Use an allowed host, or ask the operator to add it to allow_hosts",
                    server=server.name,
                )


def _check_tool_refs(contract: Contract, layers: list[Layer], effective: dict[str, Any]) -> None:
    """Refuse a step or done check naming a server that is not declared or a tool it does not allowlist.

    Such a step is denied ``not_mounted`` at run time and such a check can never pass, so the
    mistake is caught here, with its key path and the closest declared name.
    """
    servers = {server.name: server for server in contract.mcp.servers}
    refs: list[tuple[KeyPath, str, str]] = [
        (("agent", "steps", i, "tool"), step.tool, f"step {i}") for i, step in enumerate(contract.agent.steps)
    ]
    refs += [
        (("done", "checks", i, "tool"), check.tool, f"done check {i} ({check.kind})")
        for i, check in enumerate(contract.done.checks)
        if check.tool is not None
    ]
    for path, ref, what in refs:
        server_name, _, tool = ref.removeprefix("mcp:").partition(":")
        server = servers.get(server_name)
        if server is None:
            close = closest(server_name, servers)
            hint = f"Did you mean {f'mcp:{close}:{tool}'!r}? " if close else ""
            declared = ", ".join(sorted(servers)) or "none"
            raise error_in(
                layers,
                effective,
                path,
                f"{what} names {ref!r}, but no server {server_name!r} is declared in [[mcp.servers]]",
                remedy=f"{hint}Declare the server, or name one that is (declared: {declared})",
                tool=ref,
                server=server_name,
            )
        if "*" in server.allow_tools or tool in server.allow_tools:
            continue
        close = closest(tool, server.allow_tools)
        hint = f"Did you mean {f'mcp:{server_name}:{close}'!r}? " if close else ""
        raise error_in(
            layers,
            effective,
            path,
            f"{what} names {ref!r}, but {tool!r} is not in server {server_name!r}'s allow_tools, so it is "
            "never mounted",
            remedy=f"{hint}Add {tool!r} to allow_tools, or name an allowlisted tool ({', '.join(server.allow_tools)})",
            tool=ref,
            server=server_name,
        )


_GLOB_META = re.compile(r"[*?\[]")
_LITERAL_SERVER = re.compile(r"mcp:([^*?\[:]+):")


def _check_rule_tools(contract: Contract, layers: list[Layer], effective: dict[str, Any]) -> None:
    """Refuse a policy rule whose tool glob can match no tool this contract could ever mount.

    Tools are named ``mcp:<server>:<tool>`` and only declared servers are mounted (no overlay adds
    one), so a glob whose literal start cannot begin such a name (``write_file``), or that names a
    server literally (``mcp:file:*``) that is not declared, never applies: a deny or ask rule the
    author meant as a guard would silently guard nothing. A glob naming an allowlisted server's
    tool that is not allowlisted stays a ``contract check`` finding (an overlay may widen the list).
    """
    servers = {server.name for server in contract.mcp.servers}
    for i, rule in enumerate(contract.policy.rules):
        path: KeyPath = ("policy", "rules", i, "tool")
        meta = _GLOB_META.search(rule.tool)
        literal = rule.tool if meta is None else rule.tool[: meta.start()]
        if not (literal.startswith("mcp:") or "mcp:".startswith(literal)):
            raise error_in(
                layers,
                effective,
                path,
                f"policy rule {i}'s tool {rule.tool!r} matches no tool: tool names are namespaced "
                "'mcp:<server>:<tool>'",
                remedy=f"Write the namespaced name, e.g. 'mcp:<server>:{rule.tool}'",
                tool=rule.tool,
            )
        named = _LITERAL_SERVER.match(rule.tool)
        if named is None or named.group(1) in servers:
            continue
        server_name = named.group(1)
        close = closest(server_name, servers)
        hint = f"Did you mean {'mcp:' + close + rule.tool[named.end(1) :]!r}? " if close else ""
        declared = ", ".join(sorted(servers)) or "none"
        raise error_in(
            layers,
            effective,
            path,
            f"policy rule {i} names {rule.tool!r}, but no server {server_name!r} is declared in [[mcp.servers]], "
            "so the rule never applies",
            remedy=f"{hint}Name a declared server (declared: {declared}), or remove the rule",
            tool=rule.tool,
            server=server_name,
        )


def _operator_sandboxes(config: Layer | None) -> dict[str, Sandbox]:
    """The operator config's per-server ``sandbox`` tables, validated on their own and located there."""
    if config is None:
        return {}
    picked = [{"name": s["name"], "sandbox": s["sandbox"]} for s in servers_of(config) if "sandbox" in s]
    if not picked:
        return {}
    data: dict[str, Any] = {"mcp": {"servers": picked}}
    try:
        tables = OperatorTables.model_validate(data)
    except ValidationError as exc:
        raise from_validation(exc, [config], data) from None
    return {server.name: server.sandbox for server in tables.mcp.servers}


def _key_path(text: str) -> KeyPath:
    """``"sandbox.allow_hosts[0]"`` -> ``("sandbox", "allow_hosts", 0)``."""
    return tuple(int(index) if index else key for key, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", text))


def _apply_sandboxes(
    contract: Contract, layers: list[Layer], effective: dict[str, Any], config: Layer | None
) -> Contract:
    """Each stdio server's effective ``sandbox`` (``truss.contract.sandbox.effective_sandbox``)."""
    harness = contract.harness
    own = _operator_sandboxes(config)
    servers = list(contract.mcp.servers)
    for i, server in enumerate(servers):
        ceiling = own.get(server.name)
        if server.transport != "stdio":
            if ceiling is not None and config is not None:
                j = next(k for k, s in enumerate(servers_of(config)) if s["name"] == server.name)
                raise config.error(
                    f"server {server.name!r}: a sandbox confines a stdio server Truss starts; an http server is not "
                    "a process Truss starts",
                    ("mcp", "servers", j, "sandbox"),
                    remedy="Remove the sandbox table; [harness] allow_hosts says which hosts HTTP server URLs may name",
                    server=server.name,
                )
            continue
        try:
            sandbox = effective_sandbox(harness.sandbox, harness.sandbox_profile, ceiling, server.sandbox)
        except ContractError as exc:
            where = _key_path(str(exc.fields.get("path") or "sandbox"))
            raise error_in(layers, effective, ("mcp", "servers", i, *where), exc.message, remedy=exc.remedy,
                           server=server.name) from None  # fmt: skip
        if sandbox != server.sandbox:
            servers[i] = server.model_copy(update={"sandbox": sandbox})
    if servers == contract.mcp.servers:
        return contract
    return contract.model_copy(update={"mcp": contract.mcp.model_copy(update={"servers": servers})})


def load_contract(
    path: Path | str,
    *,
    home: Path | str | None = None,
    agent_file: Path | str | None = None,
    overlay: Path | str | None = None,
    params: Mapping[str, Any] | None = None,
    param_args: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    providers: Registry[ProviderKind] | None = None,
    checks: Registry[CheckKind] | None = None,
    require_params: bool = True,
) -> Contract:
    """The effective contract of the file at ``path`` with its layers (see ``truss.contract.layers``).

    ``home``: the Truss home whose ``config.toml`` (if present) is the operator layer.
    ``params``: typed values from a caller (serve-mcp); ``param_args``: ``["k=v"]`` from the
    command line, typed by the contract's specs. ``environ``: when given, every ``${env.X}`` the
    contract uses must be set in it (values are not read into the contract). ``providers`` and
    ``checks``: the registries ``agent.provider`` and each done check's ``kind`` must be found in
    (default ``PROVIDER_KINDS`` and ``DONE_CHECKS``). ``require_params=False``: a required param
    without a value is left out of ``param_values`` instead of refused (``truss mcp list`` and
    ``probe --contract`` only connect servers, which no param reaches; such a contract cannot run).
    """
    config_text: tuple[str, str] | None = None
    if home is not None:
        config_path = Path(home) / "config.toml"
        if config_path.exists():
            config_text = (str(config_path), read_toml_file(config_path, role="operator config"))
    return load_contract_text(
        read_toml_file(path),
        source=str(path),
        config=config_text,
        agent=(str(agent_file), read_toml_file(agent_file, role="agent")) if agent_file is not None else None,
        overlay=(str(overlay), read_toml_file(overlay, role="overlay")) if overlay is not None else None,
        params=params,
        param_args=param_args,
        environ=environ,
        providers=providers,
        checks=checks,
        require_params=require_params,
    )


def load_contract_text(
    text: str,
    *,
    source: str,
    config: tuple[str, str] | None = None,
    agent: tuple[str, str] | None = None,
    overlay: tuple[str, str] | None = None,
    params: Mapping[str, Any] | None = None,
    param_args: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    providers: Registry[ProviderKind] | None = None,
    checks: Registry[CheckKind] | None = None,
    require_params: bool = True,
) -> Contract:
    """``load_contract`` over texts: each layer is ``(file name for messages, TOML text)``. No I/O."""
    contract_layer = parse_layer(text, file=source, role="contract")
    config_layer = parse_layer(config[1], file=config[0], role="operator config") if config else None
    agent_layer = parse_layer(agent[1], file=agent[0], role="agent") if agent else None
    overlay_layer = parse_layer(overlay[1], file=overlay[0], role="overlay") if overlay else None
    layers = [x for x in (config_layer, agent_layer, contract_layer, overlay_layer) if x is not None]

    effective = merge_layers(config_layer, agent_layer, contract_layer, overlay_layer)
    try:
        contract = Contract.model_validate(effective, context=validation_context(providers, checks))
    except ValidationError as exc:
        raise from_validation(exc, layers, effective) from None
    check_templates(layers, effective, contract.contract.params)
    _check_harness(contract, layers, effective)
    _check_tool_refs(contract, layers, effective)
    _check_rule_tools(contract, layers, effective)
    contract = _apply_sandboxes(contract, layers, effective, config_layer)

    given: dict[str, Any] = dict(params or {})
    if param_args:
        try:
            parsed = parse_param_args(param_args, contract.contract.params)
        except UsageError as exc:
            name = exc.fields.get("param")
            raise contract_layer.error(
                exc.message, ("contract", "params", *([name] if name else [])), remedy=exc.remedy, param=name
            ) from None
        for name, value in parsed.items():
            if name in given:
                raise UsageError(f"param {name!r} is given twice", remedy="Give each param once", param=name)
            given[name] = value
    values = param_values(contract, contract_layer, given, require=require_params)
    contract = contract.model_copy(update={"param_values": values})

    if environ is not None:
        for name in env_refs(contract):
            if name not in environ:
                raise contract_layer.error(
                    f"the contract uses ${{env.{name}}}, and {name} is not set",
                    ("contract", "intent"),
                    remedy=f"Set {name} in the environment that runs Truss",
                    env=name,
                )
    try:
        contract_hash(contract)
    except CanonicalError as exc:
        raise contract_layer.error(
            f"the contract has no canonical JSON form: {exc}", remedy="Simplify the value"
        ) from None
    return contract


def validation_context(
    providers: Registry[ProviderKind] | None = None, checks: Registry[CheckKind] | None = None
) -> dict[str, Any]:
    """The pydantic context for ``Contract.model_validate`` that validates against these registries.

    Without one, the models use ``PROVIDER_KINDS`` and ``DONE_CHECKS``.
    """
    return {PROVIDERS_KEY: providers or PROVIDER_KINDS, CHECKS_KEY: checks or DONE_CHECKS}
