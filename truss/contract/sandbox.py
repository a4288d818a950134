"""``[mcp.servers.sandbox]`` and the operator's ``[harness] sandbox`` keys: the tables, and each stdio server's sandbox.

``Sandbox`` is a ``sandbox`` table as a contract, an ``--mcp-config`` overlay or the operator config
writes it (per server, or as the operator's baseline ``[harness.sandbox_profile]``); each key is
checked on its own, so that a bad value is located at its key. The rules (paths, hosts, sizes,
limits, layering) are the sandbox profile's own (``truss._sandbox_profile``, shared with the
launcher that enforces it); this module only gives them the contract's form.

``effective_sandbox`` decides, when a contract loads, the sandbox of one stdio server from four
inputs: the operator's level (``off`` | ``required`` | ``enforced``), the operator's baseline, the
operator config's own ``sandbox`` table for that server (a ceiling like the baseline: the operator
wrote it) and the contract's table (with the overlay's keys merged in). The result replaces the
server's ``sandbox`` in the effective contract, in a normal form (every key written out, sizes in
bytes, CPU time in seconds), so the recorded and hashed contract says exactly what the server
gets: ``None`` (unconfined: level ``off`` and no table), ``{enabled = false}`` (opted out, where
the operator allows it), or the profile. A contract's table that would loosen what the operator
set is refused with the key it is about. ``Sandbox.profile()`` turns the effective table back into
the ``Profile`` the launcher enforces. Pure.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from truss._errors import ContractError
from truss._sandbox_profile import (
    Limits,
    OperatorSandbox,
    Profile,
    SandboxTable,
    merge_profiles,
    normalise_bind,
    parse_host_rule,
    parse_table,
)
from truss.contract.fields import KeyValueError, Model

__all__ = ["SANDBOX_LEVELS", "Sandbox", "SandboxLevel", "SandboxLimits", "effective_sandbox", "profile_table"]

SandboxLevel = Literal["off", "required", "enforced"]
SANDBOX_LEVELS: tuple[SandboxLevel, ...] = ("off", "required", "enforced")
_MAX_LIST = 256


def _refusal(exc: ContractError) -> KeyValueError:
    return KeyValueError(exc.message, remedy=exc.remedy or "See docs/contracts.md, [mcp.servers.sandbox]")


def _bind(value: str) -> str:
    try:
        return normalise_bind(value)
    except ValueError as exc:
        raise KeyValueError(str(exc), remedy="Write an absolute path such as /srv/data") from None


def _host(value: str) -> str:
    try:
        return str(parse_host_rule(value))
    except ValueError as exc:
        raise KeyValueError(str(exc), remedy='Write "host:port", e.g. "api.github.com:443"') from None


def _limit(key: str) -> Any:
    def check(value: Any) -> Any:
        try:
            parse_table({"limits": {key: value}})
        except ContractError as exc:
            raise _refusal(exc) from None
        return value

    return AfterValidator(check)


BindPath = Annotated[str, AfterValidator(_bind)]
HostPort = Annotated[str, AfterValidator(_host)]


class SandboxLimits(Model):
    """``limits = { memory = "512M", processes = 64, cpu = "120s", file_size = "100M" }``."""

    memory: Annotated[int | str, _limit("memory")] | None = None
    processes: Annotated[int, _limit("processes")] | None = None
    cpu: Annotated[int | str, _limit("cpu")] | None = None
    file_size: Annotated[int | str, _limit("file_size")] | None = None


class Sandbox(Model):
    """One ``sandbox`` table (docs/contracts.md, ``[mcp.servers.sandbox]``); unset keys are ``None``."""

    enabled: bool | None = None
    required: bool | None = None
    read: list[BindPath] = Field(default_factory=list[str], max_length=_MAX_LIST)
    write: list[BindPath] = Field(default_factory=list[str], max_length=_MAX_LIST)
    network: Literal["none", "allow", "host"] | None = None
    allow_hosts: list[HostPort] | None = Field(default=None, max_length=_MAX_LIST)
    limits: SandboxLimits | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Sandbox:
        try:
            self.table()
        except ContractError as exc:
            raise _refusal(exc) from None
        return self

    def table(self) -> SandboxTable:
        """The table as the profile rules read it (raises ``ContractError``)."""
        return parse_table(self.model_dump(mode="json", exclude_none=True))

    def profile(self) -> Profile | None:
        """The profile this (effective) table gives, or ``None`` when the server opted out."""
        return merge_profiles(OperatorSandbox(), self.table())


class _OperatorServer(Model):
    name: str
    sandbox: Sandbox


class _OperatorServers(Model):
    servers: list[_OperatorServer]


class OperatorTables(Model):
    """The ``sandbox`` tables of the operator config's ``[[mcp.servers]]`` (validated on their own:
    they are ceilings, not values the contract's keys override)."""

    mcp: _OperatorServers


def profile_table(profile: Profile) -> dict[str, Any]:
    """A profile as its effective ``sandbox`` table: every key written out, sizes in bytes, CPU in seconds."""
    limits = profile.limits
    written = {
        "memory": limits.memory,
        "processes": limits.processes,
        "cpu": limits.cpu_s,
        "file_size": limits.file_size,
    }
    table: dict[str, Any] = {
        "required": profile.required,
        "read": list(profile.read),
        "write": list(profile.write),
        "network": profile.network,
    }
    if profile.network == "allow":
        table["allow_hosts"] = [str(rule) for rule in profile.allow_hosts]
    kept = {key: value for key, value in written.items() if value is not None}
    if kept:
        table["limits"] = kept
    return table


def _over(base: SandboxTable, top: SandboxTable) -> SandboxTable:
    """The operator's own table for a server over its baseline: the operator may set anything (keys
    it writes replace the baseline's; binds add up)."""

    def pick(low: Any, high: Any) -> Any:
        return low if high is None else high

    limits = Limits(**{name: pick(getattr(base.limits, name), getattr(top.limits, name)) for name in
                       ("memory", "processes", "cpu_s", "file_size")})  # fmt: skip
    write = tuple(dict.fromkeys([*base.write, *top.write]))
    read = tuple(p for p in dict.fromkeys([*base.read, *top.read]) if p not in write)
    network = pick(base.network, top.network)
    # A host list without a network mode is still a ceiling for a contract that picks "allow".
    hosts = pick(base.allow_hosts, top.allow_hosts) if network in ("allow", None) else None
    return replace(base, required=pick(base.required, top.required), read=read, write=write, network=network,
                   allow_hosts=hosts, limits=limits)  # fmt: skip


def effective_sandbox(
    level: SandboxLevel | None,
    baseline: Sandbox | None,
    operator_table: Sandbox | None,
    contract_table: Sandbox | None,
) -> Sandbox | None:
    """The effective ``sandbox`` of one stdio server (see the module docstring).

    Raises ``ContractError`` whose ``path`` starts with ``sandbox`` (``sandbox.network``) when the
    contract's table would loosen what the operator set.
    """
    base = baseline.table() if baseline is not None else SandboxTable()
    mine = contract_table.table() if contract_table is not None else None
    chosen: SandboxLevel = level or "off"
    own = operator_table.table() if operator_table is not None else None
    if own is not None and own.enabled is False:
        # The operator exempts this server: it runs unconfined unless its contract confines it.
        chosen = "off"
    elif own is not None:
        if mine is not None and mine.enabled is False:
            raise ContractError(
                "this server opts out of the sandbox, but the operator config gives it a sandbox table",
                remedy="Remove enabled = false; the operator decides this server's sandbox",
                path="sandbox.enabled",
            )
        base = _over(base, own)
        chosen = "enforced"
    profile = merge_profiles(OperatorSandbox(level=chosen, baseline=base), mine)
    if profile is None:
        # Opted out or exempted by the operator: written out, so the record says so.
        return Sandbox(enabled=False) if mine is not None or own is not None or chosen != "off" else None
    return Sandbox.model_validate(profile_table(profile))
