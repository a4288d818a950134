"""The sandbox profile: what a confined stdio server may read, write and reach, and its limits.

Pure values and pure functions only (no I/O, no clock): ``parse_table`` turns a TOML table into a
``SandboxTable`` (what was written, unset keys left ``None``) with one error per bad key;
``merge_profiles`` layers a contract's table over the operator's baseline into the effective
``Profile``, refusing anything that would loosen what the operator set; ``match_host`` decides
whether the egress proxy may open a connection.

Layering rules (docs/sandbox.md):

* ``required``: the contract's when it sets it, else the operator's, else true; ``false`` over
  the operator's ``true`` is refused (a contract may harden, never soften), and so is ``false``
  under the level ``enforced`` unless the operator's baseline says ``false`` itself (it would let
  the server run unconfined where bwrap cannot run).
* ``network``: ordered ``none`` < ``allow`` < ``host``; a contract may pick a lower mode than the
  operator's, a higher one is refused. Unset on both sides: ``none``.
* ``allow_hosts``: when the operator lists hosts (whether or not it also sets ``network``), every
  host a contract lists must be covered by one of them (the same port; a wildcard covers its
  subdomains and the same wildcard; an address or ``localhost``, which the proxy lets reach
  internal addresses, only by the same rule); the contract's list then replaces the operator's.
  Without an operator list the contract's list stands.
* ``limits``: each limit is the contract's when it is at or below the operator's, and the
  operator's when the contract leaves it unset; a contract that raises one is refused.
* ``read``/``write``: the union of both sides. A contract may not make writable a path the
  operator bound read-only (or anything inside one).
* Opting out (``enabled = false``) is accepted under the operator level ``off`` and ``required``
  and refused under ``enforced``.

This module does not decide where Truss's home is or which paths a command needs: binds are
checked against those in ``truss.mcp.sandbox._argv``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from truss._clock import parse_duration_ms
from truss._errors import ContractError

__all__ = [
    "NETWORK_MODES",
    "NEVER_BIND",
    "HostRule",
    "Limits",
    "NetworkMode",
    "OperatorLevel",
    "OperatorSandbox",
    "Profile",
    "SandboxTable",
    "match_host",
    "merge_profiles",
    "parse_host_rule",
    "parse_operator",
    "parse_size",
    "parse_table",
]

NetworkMode = Literal["none", "allow", "host"]
NETWORK_MODES: tuple[NetworkMode, ...] = ("none", "allow", "host")
_NETWORK_RANK = {mode: rank for rank, mode in enumerate(NETWORK_MODES)}

OperatorLevel = Literal["off", "required", "enforced"]
_OPERATOR_LEVELS: tuple[OperatorLevel, ...] = ("off", "required", "enforced")

_KEYS = frozenset({"enabled", "required", "read", "write", "network", "allow_hosts", "limits"})
_LIMIT_KEYS = ("memory", "processes", "cpu", "file_size")

_MAX_BINDS = 256
_MAX_HOSTS = 256
_MAX_PATH_CHARS = 4096
_MAX_PROCESSES = 1_000_000
_MAX_CPU_S = 365 * 24 * 3600
_MIN_MEMORY = 16 * 1024 * 1024  # below this not even an interpreter starts: a typo, not a limit
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^([0-9]+)\s*([KMGT]?)(?:i?B)?\Z", re.IGNORECASE)
_LABEL_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
# Kernel file systems a bind would expose from the host, not from the sandbox's own mounts.
NEVER_BIND = ("/proc", "/sys", "/dev")


@dataclass(frozen=True)
class Limits:
    """Kernel limits for a confined server. ``None`` means not limited by Truss.

    ``memory`` and ``file_size`` are bytes, ``cpu_s`` whole seconds of CPU time per process,
    ``processes`` the number of tasks (threads count, as the kernel counts them).
    """

    memory: int | None = None
    processes: int | None = None
    cpu_s: int | None = None
    file_size: int | None = None

    def as_json(self) -> dict[str, int | None]:
        return {"memory": self.memory, "processes": self.processes, "cpu_s": self.cpu_s, "file_size": self.file_size}


@dataclass(frozen=True)
class HostRule:
    """One ``allow_hosts`` entry: ``api.github.com:443``, ``*.example.com:443``, ``*:443``, ``[::1]:8443``.

    ``host`` is lower case without a trailing dot; an IPv6 literal is kept without brackets.
    ``wildcard`` rules match subdomains at any depth, never the bare domain; ``host == "*"``
    matches any host on ``port``.
    """

    host: str
    port: int
    wildcard: bool = False

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'*.' if self.wildcard else ''}{host}:{self.port}"

    @property
    def is_literal(self) -> bool:
        """True for an IP address or ``localhost``: the operator named the address itself."""
        return self.host == "localhost" or _is_ip(self.host)

    def matches(self, host: str, port: int) -> bool:
        if port != self.port:
            return False
        if self.host == "*":
            return True
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host

    def covers(self, other: HostRule) -> bool:
        """True when every (host, port) ``other`` matches is matched by this rule too, as safely.

        An address or ``localhost`` is covered only by the same rule: the proxy lets such a rule
        reach this host or its local network (loopback, private addresses), which a name, a
        wildcard or ``*`` never does.
        """
        if other.port != self.port:
            return False
        if other.is_literal:
            return other == self
        if self.host == "*":
            return True
        if other.host == "*":
            return False
        if self.wildcard:
            return other.host.endswith("." + self.host) or (other.wildcard and other.host == self.host)
        return not other.wildcard and other.host == self.host


@dataclass(frozen=True)
class SandboxTable:
    """A ``sandbox`` table as written (contract or operator baseline); unset keys are ``None``."""

    enabled: bool | None = None
    required: bool | None = None
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    network: NetworkMode | None = None
    allow_hosts: tuple[HostRule, ...] | None = None
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True)
class OperatorSandbox:
    """The operator's sandbox setting: a level and a baseline table.

    ``off``: only servers whose contract has a sandbox table are confined. ``required``: every
    stdio server is confined unless its contract opts out by name (``enabled = false``, which is
    recorded). ``enforced``: every stdio server is confined and an opt-out is refused.
    """

    level: OperatorLevel = "off"
    baseline: SandboxTable = field(default_factory=SandboxTable)


@dataclass(frozen=True)
class Profile:
    """The effective sandbox of one stdio server (after layering); what the launcher enforces."""

    required: bool = True
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    network: NetworkMode = "none"
    allow_hosts: tuple[HostRule, ...] = ()
    limits: Limits = field(default_factory=Limits)

    def as_json(self) -> dict[str, Any]:
        return {
            "required": self.required,
            "read": list(self.read),
            "write": list(self.write),
            "network": self.network,
            "allow_hosts": [str(rule) for rule in self.allow_hosts],
            "limits": self.limits.as_json(),
        }


# -- parsing ------------------------------------------------------------------------------------


def _bad(where: str, key: str, message: str, remedy: str) -> ContractError:
    return ContractError(message, remedy=remedy, path=f"{where}.{key}" if where else key)


def parse_table(table: Mapping[str, Any], *, where: str = "sandbox") -> SandboxTable:
    """Validate a ``sandbox`` table. Raises ``ContractError`` naming the key path under ``where``."""
    if not isinstance(table, Mapping):  # pyright: ignore[reportUnnecessaryIsInstance] - TOML input
        raise ContractError("the sandbox setting must be a table", remedy="Write it as [....sandbox]", path=where)
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise _bad(
            where,
            unknown[0],
            f"unknown sandbox key {unknown[0]!r}",
            f"Use only {', '.join(sorted(_KEYS))} (see docs/sandbox.md)",
        )
    enabled = _bool(table, "enabled", where)
    required = _bool(table, "required", where)
    read = _paths(table.get("read", ()), where, "read")
    write = _paths(table.get("write", ()), where, "write")
    both = sorted(set(read) & set(write))
    if both:
        raise _bad(where, "write", f"{both[0]} is listed in both read and write", "List each path once")
    network: NetworkMode | None = None
    if "network" in table:
        value = table["network"]
        if value not in NETWORK_MODES:
            raise _bad(where, "network", f"network must be one of none, allow, host, not {value!r}", 'Write "none"')
        network = value
    hosts: tuple[HostRule, ...] | None = None
    if "allow_hosts" in table:
        raw = table["allow_hosts"]
        if not isinstance(raw, list | tuple) or len(raw) > _MAX_HOSTS:  # pyright: ignore[reportUnknownArgumentType]
            raise _bad(
                where, "allow_hosts", f"allow_hosts must be a list of at most {_MAX_HOSTS} host:port strings", ""
            )
        rules: list[HostRule] = []
        for i, item in enumerate(raw):  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
            try:
                rules.append(parse_host_rule(item))
            except ValueError as exc:
                raise _bad(
                    where, f"allow_hosts[{i}]", str(exc), 'Write "host:port", e.g. "api.github.com:443"'
                ) from None
        hosts = tuple(dict.fromkeys(rules))
    if network in ("none", "host") and hosts:
        raise _bad(
            where,
            "allow_hosts",
            f'allow_hosts applies only to network = "allow", not {network!r}',
            'Set network = "allow" or remove allow_hosts',
        )
    limits = _limits(table.get("limits", {}), where)
    return SandboxTable(
        enabled=enabled, required=required, read=read, write=write, network=network, allow_hosts=hosts, limits=limits
    )


def parse_operator(value: Any, baseline: Mapping[str, Any] | None = None, *, where: str = "harness") -> OperatorSandbox:
    """The operator's ``[harness] sandbox = "off" | "required" | "enforced"`` and its baseline table."""
    level = "off" if value is None else value
    if level not in _OPERATOR_LEVELS:
        raise ContractError(
            f"harness sandbox must be one of off, required, enforced, not {value!r}",
            remedy='Write sandbox = "required"',
            path=f"{where}.sandbox",
        )
    table = parse_table(baseline or {}, where=f"{where}.sandbox_profile")
    if table.enabled is not None:
        raise ContractError(
            "the operator's baseline cannot set enabled; the level says which servers are confined",
            remedy="Remove enabled from the baseline",
            path=f"{where}.sandbox_profile.enabled",
        )
    return OperatorSandbox(level=level, baseline=table)


def _bool(table: Mapping[str, Any], key: str, where: str) -> bool | None:
    if key not in table:
        return None
    value = table[key]
    if not isinstance(value, bool):
        raise _bad(where, key, f"{key} must be true or false, not {value!r}", f"Write {key} = true")
    return value


def _paths(raw: Any, where: str, key: str) -> tuple[str, ...]:
    if not isinstance(raw, list | tuple) or len(raw) > _MAX_BINDS:  # pyright: ignore[reportUnknownArgumentType]
        raise _bad(where, key, f"{key} must be a list of at most {_MAX_BINDS} absolute paths", 'Write ["/srv/data"]')
    out: list[str] = []
    for i, item in enumerate(raw):  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
        try:
            out.append(normalise_bind(item))
        except ValueError as exc:
            raise _bad(where, f"{key}[{i}]", str(exc), "Write an absolute path such as /srv/data") from None
    return tuple(dict.fromkeys(out))


def normalise_bind(path: Any) -> str:
    """An absolute, normalised path; refuses ``..``, NUL, ``/`` itself and the kernel file systems."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"a bind must be a non-empty string, not {path!r}")
    if len(path) > _MAX_PATH_CHARS or "\0" in path or any(ord(c) < 0x20 for c in path):
        raise ValueError("a bind path holds control characters or is too long")
    if not path.startswith("/"):
        raise ValueError(f"{path!r} is not an absolute path")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{path!r} holds '..'")
    if not parts:
        raise ValueError("binding / would expose the whole file system")
    norm = "/" + "/".join(parts)
    for root in NEVER_BIND:
        if norm == root or norm.startswith(root + "/"):
            raise ValueError(f"{norm} is inside {root}, which the sandbox mounts afresh and never binds from the host")
    return norm


def parse_host_rule(text: Any) -> HostRule:
    """``"api.github.com:443"`` -> ``HostRule``. Raises ``ValueError`` with a readable reason."""
    if not isinstance(text, str) or not text or len(text) > 300:
        raise ValueError(f"an allowed host must be a 'host:port' string, not {text!r}")
    raw = text.strip().lower()
    if raw.startswith("["):
        close = raw.find("]")
        if close < 0 or raw[close + 1 : close + 2] != ":":
            raise ValueError(f"{text!r}: write an IPv6 address as [addr]:port")
        host, port_text = raw[1:close], raw[close + 2 :]
        if not _is_ip(host):
            raise ValueError(f"{text!r}: {host!r} is not an IPv6 address")
    else:
        host, sep, port_text = raw.rpartition(":")
        if not sep or not host:
            raise ValueError(f"{text!r} has no port: write 'host:port'")
    if not port_text.isdigit() or not port_text.isascii() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
    port = int(port_text)
    if host == "*":
        return HostRule("*", port)
    wildcard = host.startswith("*.")
    if wildcard:
        host = host[2:]
    host = host.rstrip(".")
    if _is_ip(host):
        if wildcard:
            raise ValueError(f"{text!r}: a wildcard applies to domain names, not addresses")
        return HostRule(str(ipaddress.ip_address(host)), port)
    if not host.isascii():
        raise ValueError(f"{text!r}: write an internationalised name in its ASCII (xn--) form")
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL_RE.match(label) for label in labels):
        raise ValueError(f"{text!r} is not a valid host name")
    if labels[-1].isdigit():
        # No top-level domain is numeric; such a name is an address in another form (the resolver
        # reads 192.168.1 as 192.168.0.1) and a wildcard on it matches addresses (*.0.1: 10.0.0.1).
        raise ValueError(f"{text!r}: the last label of a host name cannot be a number; write an address whole")
    if wildcard and len(labels) < 2:
        raise ValueError(f"{text!r}: a wildcard needs a domain with at least two labels, e.g. '*.example.com:443'")
    return HostRule(host, port, wildcard)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def parse_size(value: Any) -> int:
    """``536870912``, ``"512M"``, ``"1GiB"`` -> bytes (K, M, G, T are powers of 1024)."""
    if isinstance(value, bool):
        raise ValueError(f"a size must be bytes or a string such as '512M', not {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and (match := _SIZE_RE.match(value.strip())):
        number = int(match.group(1)) * _SIZE_UNITS[match.group(2).upper()]
    else:
        raise ValueError(f"a size must be bytes or a string such as '512M', not {value!r}")
    if number <= 0 or number > 1 << 60:
        raise ValueError(f"a size must be positive and below 1 EiB, not {value!r}")
    return number


def _limits(raw: Any, where: str) -> Limits:
    key_where = f"{where}.limits"
    if not isinstance(raw, Mapping):
        raise ContractError("limits must be a table", remedy='Write limits = { memory = "512M" }', path=key_where)
    table: Mapping[str, Any] = raw  # pyright: ignore[reportUnknownVariableType]
    unknown = sorted(set(table) - set(_LIMIT_KEYS))
    if unknown:
        raise _bad(key_where, unknown[0], f"unknown limit {unknown[0]!r}", f"Use only {', '.join(_LIMIT_KEYS)}")
    memory = file_size = processes = cpu_s = None
    try:
        if "memory" in table:
            memory = parse_size(table["memory"])
            if memory < _MIN_MEMORY:
                raise ValueError(f"memory {table['memory']!r} is below 16M, too little for any server to start")
    except ValueError as exc:
        raise _bad(key_where, "memory", str(exc), 'Write memory = "512M"') from None
    try:
        if "file_size" in table:
            file_size = parse_size(table["file_size"])
    except ValueError as exc:
        raise _bad(key_where, "file_size", str(exc), 'Write file_size = "100M"') from None
    if "processes" in table:
        value = table["processes"]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= _MAX_PROCESSES:
            raise _bad(key_where, "processes", f"processes must be a whole number from 1 to {_MAX_PROCESSES}", "")
        processes = value
    if "cpu" in table:
        cpu_s = _cpu_seconds(table["cpu"], key_where)
    return Limits(memory=memory, processes=processes, cpu_s=cpu_s, file_size=file_size)


def _cpu_seconds(value: Any, where: str) -> int:
    seconds: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    elif isinstance(value, str):
        try:
            # RLIMIT_CPU counts whole seconds; a fraction rounds up so the limit is never tighter.
            seconds = -(-parse_duration_ms(value) // 1000)
        except ValueError as exc:
            raise _bad(where, "cpu", str(exc), 'Write cpu = "120s"') from None
    if seconds is None or not 0 < seconds <= _MAX_CPU_S:
        raise _bad(where, "cpu", f"cpu must be a duration from 1s to 365d, not {value!r}", 'Write cpu = "120s"')
    return seconds


# -- layering -----------------------------------------------------------------------------------


def merge_profiles(
    operator: OperatorSandbox, contract: SandboxTable | None, *, where: str = "sandbox"
) -> Profile | None:
    """The effective profile of one stdio server, or ``None`` when it runs unconfined.

    Raises ``ContractError`` (at ``where``) when the contract would loosen the operator's setting.
    """
    if contract is not None and contract.enabled is False:
        if operator.level == "enforced":
            raise ContractError(
                "this server opts out of the sandbox, but the operator's harness sandbox is enforced",
                remedy="Remove enabled = false, or ask the operator to lower [harness] sandbox",
                path=f"{where}.enabled",
            )
        return None
    if contract is None and operator.level == "off":
        return None
    base = operator.baseline
    table = contract or SandboxTable()
    if table.required is False and (base.required is True or (operator.level == "enforced" and base.required is None)):
        raise ContractError(
            "required = false would let this server run unconfined, but the operator requires its sandbox",
            remedy="Remove required = false",
            path=f"{where}.required",
        )
    required = next((v for v in (table.required, base.required) if v is not None), True)
    network = _merge_network(base.network, table.network, where)
    hosts = _merge_hosts(base, table, network, where)
    limits = _merge_limits(base.limits, table.limits, where)
    read, write = _merge_binds(base, table, where)
    return Profile(required=required, read=read, write=write, network=network, allow_hosts=hosts, limits=limits)


def _merge_network(base: NetworkMode | None, mine: NetworkMode | None, where: str) -> NetworkMode:
    if mine is None:
        return base or "none"
    if base is not None and _NETWORK_RANK[mine] > _NETWORK_RANK[base]:
        raise ContractError(
            f"network {mine!r} is looser than the operator's {base!r}",
            remedy=f'Use network = "{base}" or stricter',
            path=f"{where}.network",
        )
    return mine


def _merge_hosts(base: SandboxTable, mine: SandboxTable, network: NetworkMode, where: str) -> tuple[HostRule, ...]:
    if network != "allow":
        return ()
    if mine.allow_hosts is None:
        return base.allow_hosts or ()
    if base.allow_hosts is not None:  # a ceiling, whether or not the operator also set network
        for i, rule in enumerate(mine.allow_hosts):
            if not any(ceiling.covers(rule) for ceiling in base.allow_hosts):
                raise ContractError(
                    f"allowed host {rule} is not covered by the operator's allow_hosts",
                    remedy="List only hosts the operator allows: " + ", ".join(map(str, base.allow_hosts)),
                    path=f"{where}.allow_hosts[{i}]",
                )
    return mine.allow_hosts


def _merge_limits(base: Limits, mine: Limits, where: str) -> Limits:
    merged: dict[str, int | None] = {}
    for name in ("memory", "processes", "cpu_s", "file_size"):
        ceiling: int | None = getattr(base, name)
        value: int | None = getattr(mine, name)
        if value is None:
            merged[name] = ceiling
            continue
        if ceiling is not None and value > ceiling:
            key = "cpu" if name == "cpu_s" else name
            raise ContractError(
                f"limit {key} = {value} is above the operator's {ceiling}",
                remedy=f"Set {key} at or below {ceiling}, or leave it unset",
                path=f"{where}.limits.{key}",
            )
        merged[name] = value
    return replace(Limits(), **merged)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _merge_binds(base: SandboxTable, mine: SandboxTable, where: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    for i, path in enumerate(mine.write):
        for ro in base.read:
            if _inside(path, ro):
                raise ContractError(
                    f"{path} is inside {ro}, which the operator binds read-only",
                    remedy="Write elsewhere, or ask the operator to grant it in write",
                    path=f"{where}.write[{i}]",
                )
    write = tuple(dict.fromkeys([*base.write, *mine.write]))
    read = tuple(p for p in dict.fromkeys([*base.read, *mine.read]) if p not in write)
    return read, write


def match_host(rules: Sequence[HostRule], host: str, port: int) -> HostRule | None:
    """The first rule allowing ``host:port`` (host compared lower case, without a trailing dot)."""
    name = host.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if _is_ip(name):
        name = str(ipaddress.ip_address(name))
    for rule in rules:
        if rule.matches(name, port):
            return rule
    return None
