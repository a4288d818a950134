"""Contract models: every table and key of a Truss contract, validated strictly.

A contract is one TOML file (DESIGN section 2). These models refuse unknown keys at every level
(``extra="forbid"``), check names, globs, regexes, durations and sizes, and give the effective
contract a stable hash. Loading, layering and error reporting live in ``truss.contract_load``;
this module only describes and validates values. It does no I/O.

Durations stay strings in the model (``"30s"``) so that the canonical form and its hash are what
the operator wrote; ``duration_ms()`` converts them.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from truss._clock import parse_duration_ms
from truss.ledger.canonical import canonical, sha256_ref

__all__ = [
    "AgentConfig",
    "ArgCondition",
    "AsyncDecl",
    "AsyncPending",
    "Budget",
    "Contract",
    "ContractMeta",
    "DoneCheck",
    "DoneConfig",
    "Harness",
    "LedgerSettings",
    "McpConfig",
    "ParamSpec",
    "Policy",
    "PolicyRule",
    "SecretHeader",
    "Server",
    "Step",
    "ToolSettings",
    "contract_hash",
    "duration_ms",
]

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
SERVER_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
PIN_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
TOOL_REF_RE = re.compile(r"^mcp:[a-z0-9][a-z0-9_-]{0,31}:.+$")


def _check_duration(value: str) -> str:
    parse_duration_ms(value)
    return value


def _check_regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"invalid regular expression {value!r}: {exc}") from exc
    return value


def _check_glob(value: str) -> str:
    if not value:
        raise ValueError("a glob may not be empty")
    # fnmatch accepts nearly anything; refuse unbalanced character classes, which it would
    # silently treat as literals and so match something other than what the operator meant.
    depth = 0
    for ch in value:
        if ch == "[":
            depth += 1
        elif ch == "]" and depth:
            depth -= 1
    if depth:
        raise ValueError(f"invalid glob {value!r}: '[' without a closing ']'")
    re.compile(fnmatch.translate(value))
    return value


def _check_env_name(value: str) -> str:
    if not ENV_NAME_RE.match(value):
        raise ValueError(f"{value!r} is not an environment variable name (letters, digits, '_')")
    return value


def _check_pointer(value: str) -> str:
    if value and not value.startswith("/"):
        raise ValueError(f"JSON pointer {value!r} must be empty or start with '/'")
    return value


Duration = Annotated[str, AfterValidator(_check_duration)]
Regex = Annotated[str, AfterValidator(_check_regex)]
Glob = Annotated[str, AfterValidator(_check_glob)]
EnvName = Annotated[str, AfterValidator(_check_env_name)]
Pointer = Annotated[str, AfterValidator(_check_pointer)]
PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]


def duration_ms(value: str) -> int:
    """Milliseconds of a validated duration string."""
    return parse_duration_ms(value)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


# -- [contract] -------------------------------------------------------------------------------


class ParamSpec(_Model):
    """A typed parameter a caller may fill in: ``{ type = "string", max_len = 100, default = "x" }``."""

    type: Literal["string", "integer", "number", "boolean"]
    description: str | None = None
    default: str | int | float | bool | None = None
    max_len: NonNegativeInt | None = None
    min: int | float | None = None
    max: int | float | None = None
    regex: Regex | None = None
    enum: list[str | int | float | bool] | None = Field(default=None, alias="in")

    @model_validator(mode="after")
    def _default_fits(self) -> ParamSpec:
        if self.default is not None:
            problem = self.problem_with(self.default)
            if problem:
                raise ValueError(f"default {self.default!r} does not fit: {problem}")
        return self

    def problem_with(self, value: Any) -> str | None:
        """Why ``value`` does not fit this parameter, or None when it does."""
        kind = self.type
        ok = {
            "string": isinstance(value, str),
            "integer": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, int | float) and not isinstance(value, bool),
            "boolean": isinstance(value, bool),
        }[kind]
        if not ok:
            return f"expected a {kind}, got {type(value).__name__}"
        if isinstance(value, str):
            if self.max_len is not None and len(value) > self.max_len:
                return f"longer than max_len {self.max_len}"
            if self.regex is not None and not re.fullmatch(self.regex, value):
                return f"does not match {self.regex!r}"
        if isinstance(value, int | float) and not isinstance(value, bool):
            if self.min is not None and value < self.min:
                return f"below min {self.min}"
            if self.max is not None and value > self.max:
                return f"above max {self.max}"
        if self.enum is not None and value not in self.enum:
            return f"not one of {self.enum!r}"
        return None


class ContractMeta(_Model):
    name: str
    intent: str = Field(min_length=1, max_length=20_000)
    description: str | None = None
    params: dict[str, ParamSpec] = Field(default_factory=dict[str, ParamSpec])

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError(f"contract name {value!r} must be 1-64 of [a-z0-9-], starting with a letter or digit")
        return value

    @field_validator("params")
    @classmethod
    def _param_names(cls, value: dict[str, ParamSpec]) -> dict[str, ParamSpec]:
        for key in value:
            if not re.match(r"^[a-z_][a-z0-9_]{0,63}$", key):
                raise ValueError(f"param name {key!r} must be [a-z_][a-z0-9_]*")
        return value


# -- [agent] ----------------------------------------------------------------------------------


class Step(_Model):
    """One planned call of the scripted provider."""

    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict[str, Any])

    @field_validator("tool")
    @classmethod
    def _tool(cls, value: str) -> str:
        if not TOOL_REF_RE.match(value):
            raise ValueError(f"tool {value!r} must be a namespaced name 'mcp:<server>:<tool>'")
        return value


class AgentConfig(_Model):
    provider: Literal["scripted", "anthropic", "openai"] = "scripted"
    model: str | None = None
    base_url: str | None = None
    api_key_env: EnvName | None = None
    system: str | None = None
    max_turns: PositiveInt = 20
    max_parallel_calls: PositiveInt = 4
    max_output_tokens: PositiveInt = 4096
    temperature: float | None = None
    request_timeout: Duration = "120s"
    max_attempts: Annotated[int, Field(ge=1, le=10)] = 4
    steps: list[Step] = Field(default_factory=list[Step])
    final: str | None = None

    @model_validator(mode="after")
    def _provider_needs(self) -> AgentConfig:
        if self.provider != "scripted" and not self.model:
            raise ValueError(f"provider {self.provider!r} needs a model (agent.model)")
        if self.base_url is not None and not re.match(r"^https?://[^\s]+$", self.base_url):
            raise ValueError(f"base_url {self.base_url!r} must be an http:// or https:// URL")
        return self


# -- [budget] ---------------------------------------------------------------------------------


class Budget(_Model):
    max_tool_calls: NonNegativeInt = 100
    max_model_turns: PositiveInt = 20
    max_tokens: PositiveInt | None = None
    deadline: Duration = "10m"
    call_timeout: Duration = "60s"
    max_result_bytes: PositiveInt = 1_048_576
    charge_memo_hits: bool = True


# -- [policy] ---------------------------------------------------------------------------------


class ArgCondition(_Model):
    """Conditions on one argument; all given must hold for the rule to match."""

    equals: Any = None
    in_: list[Any] | None = Field(default=None, alias="in")
    glob: Glob | None = None
    not_glob: Glob | None = None
    regex: Regex | None = None
    max_len: NonNegativeInt | None = None
    min: int | float | None = None
    max: int | float | None = None

    @model_validator(mode="after")
    def _not_empty(self) -> ArgCondition:
        if not self.model_fields_set:
            raise ValueError(
                "an argument condition needs at least one of equals, in, glob, not_glob, regex, max_len, min, max"
            )
        return self


class PolicyRule(_Model):
    tool: Glob
    effect: Literal["allow", "deny", "ask"]
    reason: str | None = None
    args: dict[str, ArgCondition] = Field(default_factory=dict[str, ArgCondition])


class Policy(_Model):
    default: Literal["allow", "deny"] = "allow"
    readonly_only: bool = False
    rules: list[PolicyRule] = Field(default_factory=list[PolicyRule])


# -- [[mcp.servers]] --------------------------------------------------------------------------


class SecretHeader(_Model):
    """A header whose value comes from Truss's environment at connect time, never recorded."""

    secret_env: EnvName
    format: str = "{}"

    @field_validator("format")
    @classmethod
    def _format(cls, value: str) -> str:
        if value.count("{}") != 1:
            raise ValueError("format must contain exactly one '{}' where the secret goes")
        return value


class ToolSettings(_Model):
    name: str = Field(min_length=1, max_length=256)
    budget_calls: NonNegativeInt | None = None
    call_timeout: Duration | None = None
    pin: str | None = None
    memo: Duration | None = None

    @field_validator("pin")
    @classmethod
    def _pin(cls, value: str | None) -> str | None:
        if value is not None and not PIN_RE.match(value):
            raise ValueError(f"pin {value!r} must be 'sha256:' and 64 lower-case hex digits")
        return value


class AsyncPending(_Model):
    pointer: Pointer
    equals: Any


class AsyncDecl(_Model):
    """The signal pattern: a result matching ``pending`` suspends until ``truss signal``."""

    tool: str = Field(min_length=1)
    pending: AsyncPending
    signal: Pointer


class Server(_Model):
    name: str
    transport: Literal["stdio", "http"] = "stdio"
    command: str | None = None
    args: list[str] = Field(default_factory=list[str])
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict[str, str])
    secret_env: list[EnvName] = Field(default_factory=list[str])
    url: str | None = None
    headers: dict[str, str | SecretHeader] = Field(default_factory=dict[str, str | SecretHeader])
    allow_tools: list[str]
    budget_calls: NonNegativeInt | None = None
    call_timeout: Duration | None = None
    connect_timeout: Duration = "30s"
    secret_args: list[str] = Field(default_factory=list[str])
    retry_in_doubt: list[str] = Field(default_factory=list[str])
    tools: list[ToolSettings] = Field(default_factory=list[ToolSettings])
    async_: list[AsyncDecl] = Field(default_factory=list[AsyncDecl], alias="async")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not SERVER_NAME_RE.match(value):
            raise ValueError(f"server name {value!r} must be 1-32 of [a-z0-9_-], starting with a letter or digit")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            _check_env_name(key)
        return value

    @field_validator("allow_tools")
    @classmethod
    def _allow_tools(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError('allow_tools is empty: list the tools to mount, or ["*"] for all advertised')
        seen: set[str] = set()
        for item in value:
            if not item or item != item.strip() or any(ord(c) < 0x20 for c in item):
                raise ValueError(f"allow_tools entry {item!r} is not a tool name")
            if item in seen:
                raise ValueError(f"allow_tools lists {item!r} twice")
            seen.add(item)
        if "*" in value and len(value) > 1:
            raise ValueError('allow_tools: "*" already means every advertised tool; list it alone')
        return value

    @model_validator(mode="after")
    def _transport_fields(self) -> Server:
        if self.transport == "stdio":
            if not self.command:
                raise ValueError(f"server {self.name!r}: a stdio server needs a command")
            if self.url is not None or self.headers:
                raise ValueError(f"server {self.name!r}: url and headers belong to http servers")
        else:
            if not self.url or not re.match(r"^https?://[^\s]+$", self.url):
                raise ValueError(f"server {self.name!r}: an http server needs a url starting with http:// or https://")
            if self.command is not None or self.args or self.env or self.cwd is not None:
                raise ValueError(f"server {self.name!r}: command, args, env and cwd belong to stdio servers")
        names = [t.name for t in self.tools]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"server {self.name!r}: tool settings for {name!r} appear twice")
        if "*" not in self.allow_tools:
            allowed = set(self.allow_tools)
            for label, listed in (
                ("tools", names),
                ("retry_in_doubt", self.retry_in_doubt),
                ("async", [a.tool for a in self.async_]),
            ):
                for name in listed:
                    if name not in allowed:
                        raise ValueError(f"server {self.name!r}: {label} names {name!r}, which is not in allow_tools")
        return self

    def tool_settings(self, tool: str) -> ToolSettings | None:
        for settings in self.tools:
            if settings.name == tool:
                return settings
        return None


class McpConfig(_Model):
    servers: list[Server] = Field(default_factory=list[Server])

    @field_validator("servers")
    @classmethod
    def _unique(cls, value: list[Server]) -> list[Server]:
        seen: set[str] = set()
        for server in value:
            if server.name in seen:
                raise ValueError(f"server name {server.name!r} is declared twice")
            seen.add(server.name)
        return value

    def server(self, name: str) -> Server | None:
        for server in self.servers:
            if server.name == name:
                return server
        return None


# -- [[done.checks]] --------------------------------------------------------------------------


class DoneCheck(_Model):
    kind: Literal["tool_succeeded", "result_matches", "final_matches", "no_denials"]
    tool: str | None = None
    pointer: Pointer = ""
    regex: Regex | None = None
    equals: Any = None

    @model_validator(mode="after")
    def _fields_for_kind(self) -> DoneCheck:
        if self.kind in ("tool_succeeded", "result_matches") and not self.tool:
            raise ValueError(f"a {self.kind} check needs a tool")
        if self.tool is not None and not TOOL_REF_RE.match(self.tool):
            raise ValueError(f"tool {self.tool!r} must be a namespaced name 'mcp:<server>:<tool>'")
        if (
            self.kind in ("result_matches", "final_matches")
            and self.regex is None
            and "equals" not in self.model_fields_set
        ):
            raise ValueError(f"a {self.kind} check needs regex or equals")
        return self


class DoneConfig(_Model):
    checks: list[DoneCheck] = Field(default_factory=list[DoneCheck])


# -- [ledger], [harness] ----------------------------------------------------------------------


class LedgerSettings(_Model):
    durability: Literal["power", "process"] = "power"


class Harness(_Model):
    """Operator-only settings ($TRUSS_HOME/config.toml): which commands and hosts servers may use."""

    allow_commands: list[str] | None = None
    allow_hosts: list[str] | None = None


# -- the whole ----------------------------------------------------------------------------------


class Contract(_Model):
    contract: ContractMeta
    agent: AgentConfig = Field(default_factory=AgentConfig)
    budget: Budget = Field(default_factory=Budget)
    policy: Policy = Field(default_factory=Policy)
    mcp: McpConfig = Field(default_factory=McpConfig)
    done: DoneConfig = Field(default_factory=DoneConfig)
    ledger: LedgerSettings = Field(default_factory=LedgerSettings)
    harness: Harness = Field(default_factory=Harness)
    param_values: dict[str, str | int | float | bool] = Field(default_factory=dict[str, str | int | float | bool])

    def to_json(self) -> dict[str, Any]:
        """The JSON form whose canonical bytes are hashed (aliases, no None-valued keys)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    @property
    def hash(self) -> str:
        return contract_hash(self)


def contract_hash(contract: Contract) -> str:
    """``sha256:`` over the RFC 8785 bytes of the effective contract's JSON form."""
    return sha256_ref(canonical(contract.to_json()))
