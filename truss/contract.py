"""Contracts: the models of every table and key, and loading, layering, substitution and hashing.

A contract is one TOML file (DESIGN section 2). The models refuse unknown keys at every level
(``extra="forbid"``) and check names, globs, regexes, durations and sizes. The loader builds the
*effective* contract from its layers, most general first::

    built-in defaults (the models) <- $TRUSS_HOME/config.toml <- --agent FILE <- the contract
                                   <- --mcp-config FILE (overlay)

Tables merge key by key, arrays are replaced whole, and ``[[mcp.servers]]`` merge by ``name``.
Operator-config servers are definitions that apply only to servers the contract names; an overlay
may only refine servers the contract has; ``[harness]`` is read only from the operator config.
Every problem becomes a ``ContractError`` naming the file, the key path and, where the source text
shows it, the line: pydantic's own text never reaches a user.

``${params.X}`` and ``${env.X}`` are checked at load (declared params, valid names, and only in
``contract.intent``, step ``arguments`` and ``agent.final``) but substituted at run time by ``render_intent`` and
``render_arguments``: the effective contract keeps the templates, so environment values are never
hashed into it. ``${steps.N...}`` references are left for the scripted provider.

Reading files is the only I/O here (``load_contract``); everything else works on text and values.
Durations stay strings in the model (``"30s"``) so that the canonical form and its hash are what
the operator wrote; ``duration_ms()`` converts them.
"""

from __future__ import annotations

import datetime
import fnmatch
import json
import math
import re
import stat
import tomllib
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, cast, get_args, get_origin
from urllib.parse import parse_qsl, urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from truss._clock import parse_duration_ms
from truss._errors import ContractError, InputError, UsageError
from truss.ledger.canonical import CanonicalError, canonical, sha256_ref

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
    "decode_toml_bytes",
    "duration_ms",
    "format_path",
    "load_contract",
    "load_contract_text",
    "narrow_budget",
    "parse_param_args",
    "read_toml_file",
    "render_arguments",
    "render_intent",
    "template_refs",
]

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
SERVER_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
PIN_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
TOOL_REF_RE = re.compile(r"^mcp:[a-z0-9][a-z0-9_-]{0,31}:.+$")
CREDENTIAL_ENV_RE = re.compile(r"(?i)token|secret|passw(?:or)?d|api_?key|access_?key|private_?key|credential|cookie")
"""Environment names whose literal values would be credentials (refused in ``env``: use ``secret_env``)."""
CREDENTIAL_HEADER_RE = re.compile(r"(?i)^(?:proxy-)?authorization$|^cookie$|token|secret|api-?key|password")
# Query parameters that carry credentials in URLs (besides the names above): ?key=, ?sig=, ?auth=.
_CREDENTIAL_QUERY_RE = re.compile(r"(?i)^(?:key|auth|sig|signature|code|credentials?)$")
"""Header names whose literal values would be credentials (refused: use ``{ secret_env = ... }``)."""


def _check_duration(value: str) -> str:
    parse_duration_ms(value)
    return value


def _check_regex(value: str) -> str:
    with warnings.catch_warnings():
        # Python warns (FutureWarning) about patterns whose meaning will change, such as '[a--z]'
        # or a nested set; refusing them keeps a rule meaning the same on every Python version.
        warnings.simplefilter("error")
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"invalid regular expression {value!r}: {exc}") from exc
        except Warning as exc:
            raise ValueError(f"ambiguous regular expression {value!r}: {exc}; escape the character") from exc
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
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            re.compile(fnmatch.translate(value))
        except (re.error, Warning) as exc:
            raise ValueError(f"invalid glob {value!r}: {exc}") from exc
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

    @field_validator("regex")
    @classmethod
    def _regex_is_bounded(cls, value: str | None) -> str | None:
        # Param values come from callers (serve-mcp), so the pattern must not backtrack
        # exponentially on them; the same reading of a pattern's shape as policy conditions.
        from truss.policy import regex_profile  # here, not at the top: truss.policy imports this module

        if value is not None and regex_profile(value).nested:
            raise ValueError(
                f"regex {value!r} nests repetition, which can take exponential time on a caller's value; "
                "make the inner repetition atomic '(?>...)' or possessive ('*+', '++')"
            )
        return value

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
            article = "an" if kind == "integer" else "a"
            return f"expected {article} {kind}, got {_toml_type(value)}"
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
            return "beyond +/-2**53, which has no exact JSON number"
        if isinstance(value, float) and not math.isfinite(value):
            return "not a finite number"
        if isinstance(value, str):
            if any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
                return "holds a lone surrogate, which is not text"
            if self.max_len is not None and len(value) > self.max_len:
                return f"longer than max_len {self.max_len}"
            if self.regex is not None:
                from truss.policy import regex_profile

                limit = regex_profile(self.regex).max_chars
                if len(value) > limit:
                    return f"longer than the {limit} characters its regex is tested on"
                if not re.fullmatch(self.regex, value):
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
        for key, literal in value.items():
            _check_env_name(key)
            # The effective contract is recorded in the ledger: a credential written here would be too.
            if literal and CREDENTIAL_ENV_RE.search(key):
                raise ValueError(
                    f"env {key!r} holds a literal value and its name says it is a credential; the contract "
                    f"is recorded, so list {key!r} in secret_env and set it in Truss's environment instead"
                )
        return value

    @field_validator("url")
    @classmethod
    def _url_without_credentials(cls, value: str | None) -> str | None:
        # The effective contract is recorded and exported: a credential in the URL would be too.
        if value is None:
            return value
        parts = urlsplit(value)
        found = "user info" if "@" in parts.netloc else None
        for name, _ in parse_qsl(parts.query, keep_blank_values=True):
            if CREDENTIAL_HEADER_RE.search(name) or _CREDENTIAL_QUERY_RE.match(name):
                found = f"query parameter {name!r}"
        if found is not None:
            raise ValueError(
                f"url holds a credential ({found}); the contract is recorded, so send it as a header "
                'from the environment instead: headers = { Authorization = { secret_env = "VARIABLE", '
                'format = "Bearer {}" } }'
            )
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str | SecretHeader]) -> dict[str, str | SecretHeader]:
        for name, header in value.items():
            if isinstance(header, str) and header and CREDENTIAL_HEADER_RE.search(name):
                raise ValueError(
                    f"header {name!r} holds a literal value and carries credentials; the contract is recorded, "
                    f'so write {name} = {{ secret_env = "VARIABLE", format = "Bearer {{}}" }} instead'
                )
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
        seen: set[str] = set()
        for name in names:  # a set, not list.count: a large file must not cost quadratic time
            if name in seen:
                raise ValueError(f"server {self.name!r}: tool settings for {name!r} appear twice")
            seen.add(name)
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


# -- loading: files, layers, errors ---------------------------------------------------------------

MAX_FILE_BYTES = 1 << 20
"""A contract, config, agent or overlay file larger than this is refused unread."""

MAX_NESTING = 32
"""Tables and arrays nested deeper than this are refused (the canonical encoder stops at 128)."""

_MAX_SAFE_INT = 2**53
_CONTRACT_KEYS = ("contract", "agent", "budget", "policy", "mcp", "done", "ledger")
_CONFIG_KEYS = ("agent", "budget", "policy", "mcp", "ledger", "harness")
_DURATION_KEYS = frozenset({"deadline", "call_timeout", "connect_timeout", "request_timeout", "memo"})

KeyPath = tuple[str | int, ...]
ParamValue = str | int | float | bool


class _Layer:
    """One parsed file of the stack, kept with its text so errors can point at lines."""

    def __init__(self, role: str, file: str, text: str, data: dict[str, Any]) -> None:
        self.role = role
        self.file = file
        self.text = text
        self.data = data
        self._lines: dict[KeyPath, tuple[int, int]] | None = None

    def where(self, path: KeyPath) -> tuple[int | None, int | None]:
        """Line and column of the deepest prefix of ``path`` that the source text shows."""
        if self._lines is None:
            self._lines = _key_lines(self.text)
        for end in range(len(path), 0, -1):
            found = self._lines.get(path[:end])
            if found is not None:
                return found
        return None, None

    def error(self, message: str, path: KeyPath = (), *, remedy: str | None = None, **fields: Any) -> ContractError:
        line, column = self.where(path) if path else (None, None)
        return ContractError(
            message, remedy=remedy, file=self.file, path=format_path(path) or None, line=line, column=column, **fields
        )


def format_path(path: KeyPath) -> str:
    """``("mcp", "servers", 1, "allow_tools", 0)`` -> ``mcp.servers[1].allow_tools[0]``."""
    out = ""
    for seg in path:
        if isinstance(seg, int):
            out += f"[{seg}]"
        else:
            text = seg if re.fullmatch(r"[A-Za-z0-9_-]+", seg) else json.dumps(seg, ensure_ascii=True)
            out += ("." if out else "") + text
    return out


def read_toml_file(path: Path | str, *, role: str = "contract") -> str:
    """The text of a TOML file, or a ``ContractError`` saying plainly why it cannot be used."""
    file = str(path)
    where = Path(path)
    try:
        info = where.stat()
    except FileNotFoundError:
        raise ContractError(
            f"the {role} file does not exist", file=file, remedy="Check the path and the current directory"
        ) from None
    except OSError as exc:
        raise ContractError(
            f"cannot read the {role} file: {exc.strerror or exc}", file=file, remedy="Check the path and permissions"
        ) from None
    if stat.S_ISDIR(info.st_mode):
        raise ContractError(
            f"the {role} path is a directory, not a TOML file", file=file, remedy="Name the .toml file itself"
        )
    if not stat.S_ISREG(info.st_mode):
        raise ContractError(
            f"the {role} path is not a regular file", file=file, remedy="Name a plain .toml file (not a pipe or device)"
        )
    if info.st_size > MAX_FILE_BYTES:
        raise ContractError(
            f"the {role} file is {info.st_size} bytes, over the {MAX_FILE_BYTES}-byte limit",
            file=file,
            remedy="A contract is a short TOML file; move data out of it",
        )
    try:
        with where.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ContractError(
            f"cannot read the {role} file: {exc.strerror or exc}",
            file=file,
            remedy="Check that the file is readable by this user",
        ) from None
    if len(data) > MAX_FILE_BYTES:
        raise ContractError(
            f"the {role} file is over the {MAX_FILE_BYTES}-byte limit",
            file=file,
            remedy="A contract is a short TOML file; move data out of it",
        )
    return decode_toml_bytes(data, file=file, role=role)


def decode_toml_bytes(data: bytes, *, file: str, role: str = "contract") -> str:
    """UTF-8 text of a TOML file (a leading byte-order mark is dropped); invalid bytes are located."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ContractError(
            f"the {role} file is not UTF-8 text (byte 0x{data[exc.start]:02x})",
            file=file,
            line=line,
            column=column,
            remedy="Save the file as UTF-8",
        ) from None


def _parse(text: str, *, file: str, role: str) -> _Layer:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        line: int | None = None
        column: int | None = None
        found = re.search(r"\(at line (\d+), column (\d+)\)$", message)
        if found:
            line, column = int(found.group(1)), int(found.group(2))
        elif message.endswith("(at end of document)"):
            line = text.count("\n") + 1
        base = re.sub(r"\s*\(at [^)]*\)$", "", message)
        raise ContractError(
            f"TOML syntax error: {base}",
            file=file,
            line=line,
            column=column,
            remedy="Fix the TOML at that place (quote strings, one value per key, close every bracket)",
        ) from None
    except RecursionError:
        raise ContractError(
            "the TOML nests too deeply to read",
            file=file,
            remedy=f"Keep tables and arrays under {MAX_NESTING} levels deep",
        ) from None
    layer = _Layer(role, file, text, data)
    _check_values(layer, data, ())
    return layer


def _check_values(layer: _Layer, value: Any, path: KeyPath) -> None:
    """Refuse values that have no exact JSON form (so cannot be hashed) before anything else."""
    if len(path) > MAX_NESTING:
        raise layer.error(
            f"nested more than {MAX_NESTING} levels deep", path, remedy="Flatten the value; contracts stay shallow"
        )
    if isinstance(value, dict):
        for key, item in cast(dict[str, Any], value).items():
            _check_values(layer, item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(cast(list[Any], value)):
            _check_values(layer, item, (*path, i))
    elif isinstance(value, datetime.date | datetime.time):
        raise layer.error(
            "TOML dates and times are not supported in contracts",
            path,
            remedy='Write the value as a quoted string, e.g. "2026-01-31"',
        )
    elif isinstance(value, float) and not math.isfinite(value):
        raise layer.error("nan and inf have no JSON form", path, remedy="Use a finite number")
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > _MAX_SAFE_INT:
        raise layer.error(
            "an integer beyond +/-2**53 cannot be hashed exactly", path, remedy="Use a smaller number or a string"
        )


def _servers_of(layer: _Layer) -> list[dict[str, Any]]:
    """The ``[[mcp.servers]]`` tables of one layer, each checked for a name and known keys."""
    mcp = layer.data.get("mcp")
    if mcp is None:
        return []
    if not isinstance(mcp, dict):
        raise layer.error("[mcp] must be a table", ("mcp",), remedy="Declare servers as [[mcp.servers]] tables")
    servers = cast(dict[str, Any], mcp).get("servers", [])
    if not isinstance(servers, list) or not all(isinstance(s, dict) for s in cast(list[Any], servers)):
        raise layer.error(
            "mcp.servers must be an array of tables",
            ("mcp", "servers"),
            remedy="Declare each server under its own [[mcp.servers]] header",
        )
    known = _field_keys(Server)
    seen: dict[str, int] = {}
    out = cast(list[dict[str, Any]], servers)
    for i, server in enumerate(out):
        name = server.get("name")
        if not isinstance(name, str):
            raise layer.error(
                "a server needs a name (a string)",
                ("mcp", "servers", i),
                remedy='Add name = "..." to this [[mcp.servers]] table',
            )
        if name in seen:
            raise layer.error(
                f"server name {name!r} is declared twice (also mcp.servers[{seen[name]}])",
                ("mcp", "servers", i, "name"),
                remedy="Give each server a unique name, or merge the two tables",
            )
        seen[name] = i
        for key in server:
            if key not in known:
                raise layer.error(
                    f"unknown key {key!r} in server {name!r}",
                    ("mcp", "servers", i, key),
                    remedy=_allowed_remedy(sorted(known)),
                )
    return out


def _only_servers(layer: _Layer, what: str) -> None:
    """The layer's ``[mcp]`` table, if any, holds nothing but ``servers``."""
    mcp: Any = layer.data.get("mcp", {})
    if not isinstance(mcp, dict):
        raise layer.error("[mcp] must be a table", ("mcp",), remedy="Declare servers as [[mcp.servers]] tables")
    for key in cast(dict[str, Any], mcp):
        if key != "servers":
            raise layer.error(
                f"{what} holds only [[mcp.servers]], not mcp.{key}", ("mcp", key), remedy="Remove the key"
            )


def _deep_merge(base: Any, top: Any) -> Any:
    """Tables merge key by key; anything else (arrays included) in ``top`` replaces ``base``."""
    if isinstance(base, dict) and isinstance(top, dict):
        merged = dict(cast(dict[str, Any], base))
        for key, value in cast(dict[str, Any], top).items():
            merged[key] = _deep_merge(merged[key], value) if key in merged else value
        return merged
    return top


def _merge_layers(
    config: _Layer | None, agent: _Layer | None, contract: _Layer, overlay: _Layer | None
) -> dict[str, Any]:
    if config is not None:
        for key in config.data:
            if key not in _CONFIG_KEYS:
                raise config.error(
                    f"the operator config may not hold [{key}]",
                    (key,),
                    remedy=f"The operator config holds only {', '.join(_CONFIG_KEYS)}; put the rest in a contract",
                )
    if agent is not None:
        for key in agent.data:
            if key != "agent":
                raise agent.error(
                    f"an agent file holds only an [agent] table, not [{key}]",
                    (key,),
                    remedy="Move this table into the contract",
                )
    for key in contract.data:
        if key == "harness":
            raise contract.error(
                "[harness] is accepted only in the operator config ($TRUSS_HOME/config.toml)",
                (key,),
                remedy="Remove it from the contract; the operator sets allow_commands and allow_hosts",
            )
        if key == "param_values":
            raise contract.error(
                "param_values is computed from the caller's params, not written in a contract",
                (key,),
                remedy="Declare params under [contract.params] and pass values with --param",
            )
    if overlay is not None:
        for key in overlay.data:
            if key != "mcp":
                raise overlay.error(
                    f"an --mcp-config overlay holds only [[mcp.servers]], not [{key}]",
                    (key,),
                    remedy="Put other settings in the contract or the agent file",
                )
        _only_servers(overlay, "an --mcp-config overlay")
    if config is not None:
        _only_servers(config, "the operator config")

    effective: dict[str, Any] = {}
    config_servers: dict[str, dict[str, Any]] = {}
    if config is not None:
        config_servers = {s["name"]: s for s in _servers_of(config)}
        effective = {k: v for k, v in config.data.items() if k != "mcp"}
    if agent is not None:
        effective = _deep_merge(effective, agent.data)
    effective = _deep_merge(effective, {k: v for k, v in contract.data.items() if k != "mcp"})

    servers: dict[str, dict[str, Any]] = {}
    for server in _servers_of(contract):
        servers[server["name"]] = _deep_merge(config_servers.get(server["name"], {}), server)
    if overlay is not None:
        for i, server in enumerate(_servers_of(overlay)):
            name = server["name"]
            if name not in servers:
                raise overlay.error(
                    f"the overlay names server {name!r}, which the contract does not declare",
                    ("mcp", "servers", i, "name"),
                    remedy=f"An overlay only refines the contract's servers ({', '.join(servers) or 'none'}); "
                    "add the server to the contract first",
                )
            servers[name] = _deep_merge(servers[name], server)
    mcp_table = contract.data.get("mcp", {})
    mcp_rest = {k: v for k, v in cast(dict[str, Any], mcp_table).items() if k != "servers"}
    effective["mcp"] = {**mcp_rest, "servers": list(servers.values())}
    return effective


def _blame(layers: list[_Layer], effective: dict[str, Any], path: KeyPath) -> _Layer:
    """The layer that supplied the value at ``path`` of the effective data (the last one that has it)."""
    best: tuple[int, int, _Layer] | None = None
    for rank, layer in enumerate(layers):
        depth = _depth_in(layer, effective, path)
        if best is None or depth >= best[0]:
            best = (depth, rank, layer)
    assert best is not None
    return best[2]


def _depth_in(layer: _Layer, effective: dict[str, Any], path: KeyPath) -> int:
    """How many leading segments of the effective ``path`` exist in ``layer`` (server indices by name)."""
    mapped = _to_layer_path(layer, effective, path)
    cur: Any = layer.data
    depth = 0
    for seg in mapped:
        if isinstance(cur, dict) and isinstance(seg, str) and seg in cur:
            cur = cast(dict[str, Any], cur)[seg]
        elif isinstance(cur, list) and isinstance(seg, int) and 0 <= seg < len(cast(list[Any], cur)):
            cur = cast(list[Any], cur)[seg]
        else:
            break
        depth += 1
    return depth


def _to_layer_path(layer: _Layer, effective: dict[str, Any], path: KeyPath) -> KeyPath:
    if len(path) >= 3 and path[0] == "mcp" and path[1] == "servers" and isinstance(path[2], int):
        servers = cast(list[dict[str, Any]], effective.get("mcp", {}).get("servers", []))
        if path[2] < len(servers):
            name = servers[path[2]].get("name")
            own: Any = cast(dict[str, Any], layer.data.get("mcp") or {}).get("servers") or []
            for j, server in enumerate(cast(list[Any], own)):
                if isinstance(server, dict) and cast(dict[str, Any], server).get("name") == name:
                    return ("mcp", "servers", j, *path[3:])
            return ("mcp", "servers", -1)
    return path


def _error_in(layers: list[_Layer], effective: dict[str, Any], path: KeyPath, message: str, **kw: Any) -> ContractError:
    layer = _blame(layers, effective, path)
    err = layer.error(message, _to_layer_path(layer, effective, path), **kw)
    # The path users read is the effective one (what `contract show` prints); the line is the file's.
    err.fields["path"] = format_path(path) or None
    return err


# -- pydantic errors -> ContractError -----------------------------------------------------------

_TYPE_WORDS = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "bool_type": "a boolean (true or false)",
    "list_type": "an array",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
}


def _toml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _loc_to_path(data: Any, loc: tuple[str | int, ...], error_type: str) -> KeyPath:
    """Keep the loc segments that are real keys or indices of ``data`` (drop union member labels)."""
    path: list[str | int] = []
    cur: Any = data
    for i, seg in enumerate(loc):
        if isinstance(cur, dict) and isinstance(seg, str) and seg in cur:
            path.append(seg)
            cur = cast(dict[str, Any], cur)[seg]
        elif isinstance(cur, list) and isinstance(seg, int) and 0 <= seg < len(cast(list[Any], cur)):
            path.append(seg)
            cur = cast(list[Any], cur)[seg]
        elif i == len(loc) - 1 and error_type == "missing" and isinstance(seg, str):
            path.append(seg)
    return tuple(path)


def _model_at(path: KeyPath) -> type[BaseModel] | None:
    """The model class whose table sits at ``path`` of a contract (for listing the allowed keys)."""
    model: type[BaseModel] = Contract
    annotation: Any = Contract
    for seg in path:
        if isinstance(seg, int):
            annotation = _unwrap(annotation, list)
            continue
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
            field = next((f for n, f in model.model_fields.items() if (f.alias or n) == seg), None)
            if field is None:
                return None
            annotation = field.annotation
        else:
            annotation = _unwrap(annotation, dict)
        while get_origin(annotation) is not None and get_origin(annotation) not in (list, dict):
            inner = [a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
            annotation = inner[0] if inner else get_args(annotation)[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _unwrap(annotation: Any, container: type) -> Any:
    args = get_args(annotation)
    if get_origin(annotation) is container and args:
        return args[-1]
    return annotation


def _field_keys(model: type[BaseModel]) -> set[str]:
    return {f.alias or n for n, f in model.model_fields.items()}


def _allowed_remedy(keys: list[str]) -> str:
    return "Remove it or fix its spelling; the keys allowed here are: " + ", ".join(keys)


def _from_validation(exc: ValidationError, layers: list[_Layer], effective: dict[str, Any]) -> ContractError:
    errors = exc.errors(include_url=False)
    # Of a union's failed branches, the one that got deepest into the value says the most.
    paths = [_loc_to_path(effective, tuple(e["loc"]), e["type"]) for e in errors]
    pick = max(range(len(errors)), key=lambda i: (len(paths[i]), -i))
    first, path = errors[pick], paths[pick]
    kind = first["type"]
    key = str(path[-1]) if path and isinstance(path[-1], str) else None
    value = first.get("input")
    ctx: dict[str, Any] = dict(first.get("ctx") or {})
    remedy: str | None = None
    if kind == "extra_forbidden":
        message = f"unknown key {key!r}"
        model = _model_at(path[:-1])
        allowed = _CONTRACT_KEYS if len(path) == 1 else sorted(_field_keys(model)) if model else None
        remedy = _allowed_remedy(sorted(allowed)) if allowed else "Remove it or fix its spelling"
    elif kind == "missing":
        message = f"missing required key {key!r}"
        remedy = f"Add {key} to this table (see docs/contracts.md)"
    elif kind in _TYPE_WORDS:
        message = f"expected {_TYPE_WORDS[kind]}, found {_toml_type(value)} {_short(value)}"
        if key in _DURATION_KEYS:
            remedy = 'Durations are strings with a unit: "500ms", "30s", "5m", "2h", "1d"'
        elif key is not None and key.endswith("_bytes"):
            remedy = "Sizes are whole numbers of bytes, e.g. 1048576"
        else:
            remedy = f"Write {_TYPE_WORDS[kind]} here"
    elif kind == "literal_error":
        message = f"{_short(value)} is not allowed here"
        remedy = f"Use one of {ctx.get('expected', 'the documented values')}"
    elif kind == "value_error":
        message = str(ctx.get("error") or first["msg"])
        remedy = "See docs/contracts.md for this key"
    elif kind in ("greater_than_equal", "greater_than"):
        message = f"{_short(value)} is too small (must be at least {ctx.get('ge', ctx.get('gt'))})"
    elif kind in ("less_than_equal", "less_than"):
        message = f"{_short(value)} is too large (must be at most {ctx.get('le', ctx.get('lt'))})"
    elif kind in ("string_too_short", "string_too_long"):
        message = f"the string has the wrong length ({first['msg'].lower()})"
    else:
        message = str(first["msg"])
    if remedy is None:
        remedy = "See docs/contracts.md for what this key takes"
    others = [q for q in paths if q[: len(path)] != path and path[: len(q)] != q]
    if others:
        remedy = (remedy + "; " if remedy else "") + f"{len(others)} more problem(s) may follow once this is fixed"
    return _error_in(layers, effective, path, message, remedy=remedy)


# -- ${...} references ----------------------------------------------------------------------------

_REF_RE = re.compile(r"\$\{([^{}]*)\}")
_STEP_REF_RE = re.compile(r"^steps\.(\d+)\.(result(/.*)?|is_error)$")
_PARAM_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")


def _template_scope(path: KeyPath) -> frozenset[str] | None:
    """Which references a string at ``path`` may hold; None where no substitution is done."""
    if path == ("contract", "intent"):
        return frozenset({"params", "env"})
    if len(path) >= 4 and path[:2] == ("agent", "steps") and path[3] == "arguments":
        return frozenset({"params", "env", "steps"})
    if path == ("agent", "final"):  # the scripted provider's closing answer, written after every step
        return frozenset({"params", "env", "steps"})
    return None


def _check_templates(layers: list[_Layer], effective: dict[str, Any], params: Mapping[str, ParamSpec]) -> None:
    def walk(value: Any, path: KeyPath) -> None:
        if isinstance(value, dict):
            for key, item in cast(dict[str, Any], value).items():
                if "${" in key:
                    raise _error_in(
                        layers,
                        effective,
                        (*path, key),
                        "a key may not hold a ${...} reference",
                        remedy="References are substituted only into values of contract.intent and step arguments",
                    )
                walk(item, (*path, key))
        elif isinstance(value, list):
            for i, item in enumerate(cast(list[Any], value)):
                walk(item, (*path, i))
        elif isinstance(value, str) and "$" in value:
            _check_string(value, path)

    def _check_string(text: str, path: KeyPath) -> None:
        if "${" not in text:
            return
        scope = _template_scope(path)
        if scope is None:
            raise _error_in(
                layers,
                effective,
                path,
                "this value holds a ${...} reference, but substitution is not done here",
                remedy="${params.X} and ${env.X} work only in contract.intent and step arguments; commands, args, "
                "urls, env, headers, policy and checks are taken literally (use secret_env for secrets)",
            )
        if text.count("${") != len(_REF_RE.findall(text)):
            raise _error_in(
                layers,
                effective,
                path,
                f"unterminated or nested ${{ in {_short(text)}",
                remedy="Write references as ${params.NAME}, ${env.NAME} or ${steps.N.result}",
            )
        for match in _REF_RE.finditer(text):
            _check_ref(match.group(1), scope, path)

    def _check_ref(ref: str, scope: frozenset[str], path: KeyPath) -> None:
        head, _, rest = ref.partition(".")
        if head not in scope:
            allowed = ", ".join(f"${{{s}.…}}" for s in sorted(scope))
            raise _error_in(
                layers,
                effective,
                path,
                f"${{{ref}}} is not a reference Truss knows here",
                remedy=f"Use {allowed}",
            )
        if head == "params":
            if rest not in params:
                declared = ", ".join(sorted(params)) or "none"
                raise _error_in(
                    layers,
                    effective,
                    path,
                    f"${{{ref}}} refers to param {rest!r}, which [contract.params] does not declare",
                    remedy=f"Declare it under [contract.params] or fix the name (declared: {declared})",
                )
        elif head == "env":
            if not ENV_NAME_RE.match(rest):
                raise _error_in(
                    layers,
                    effective,
                    path,
                    f"${{{ref}}}: {rest!r} is not an environment variable name",
                    remedy="Use letters, digits and '_', not starting with a digit",
                )
        else:
            found = _STEP_REF_RE.match(ref)
            steps: Any = effective.get("agent", {}).get("steps", [])
            planned = len(cast(list[Any], steps)) if isinstance(steps, list) else 0
            step = path[2] if path[:2] == ("agent", "steps") else planned
            if not found:
                raise _error_in(
                    layers,
                    effective,
                    path,
                    f"${{{ref}}} is not a step reference",
                    remedy="Write ${steps.N.result}, ${steps.N.result/json/pointer} or ${steps.N.is_error}",
                )
            if isinstance(step, int) and int(found.group(1)) >= step:
                raise _error_in(
                    layers,
                    effective,
                    path,
                    f"${{{ref}}} in {format_path(path[:3])} refers to a step that has not run by then",
                    remedy="A step may refer only to earlier steps (lower numbers, counting from 0)",
                )

    walk(effective, ())


def template_refs(text: str) -> list[str]:
    """The references (``params.x``, ``env.Y``, ``steps.0.result``) in a template string, in order."""
    return [m.group(1) for m in _REF_RE.finditer(text)]


def _env_refs(contract: Contract) -> list[str]:
    names: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in cast(dict[str, Any], value).values():
                walk(item)
        elif isinstance(value, list):
            for item in cast(list[Any], value):
                walk(item)
        elif isinstance(value, str):
            names.extend(r[4:] for r in template_refs(value) if r.startswith("env."))

    walk(contract.contract.intent)
    walk(contract.agent.final)
    for step in contract.agent.steps:
        walk(step.arguments)
    return list(dict.fromkeys(names))


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return canonical(value).decode()
    return canonical(value).decode()


def _render(text: str, params: Mapping[str, Any], environ: Mapping[str, str], *, where: str) -> Any:
    def lookup(ref: str) -> Any:
        head, _, name = ref.partition(".")
        if head == "params":
            if name not in params:
                raise InputError(
                    f"{where}: ${{{ref}}} has no value",
                    remedy=f"Pass --param {name}=VALUE or give the param a default",
                    param=name,
                )
            return params[name]
        if head == "env":
            if name not in environ:
                raise InputError(
                    f"{where}: environment variable {name} is not set",
                    remedy=f"Set {name} in the environment that runs Truss",
                    env=name,
                )
            return environ[name]
        return None  # steps: left for the scripted provider

    whole = _REF_RE.fullmatch(text)
    if whole is not None:
        value = lookup(whole.group(1))
        return text if value is None else value

    def replace(match: re.Match[str]) -> str:
        value = lookup(match.group(1))
        return match.group(0) if value is None else _text_of(value)

    return _REF_RE.sub(replace, text)


def render_intent(contract: Contract, environ: Mapping[str, str]) -> str:
    """``contract.intent`` with ``${params.X}`` and ``${env.X}`` filled in (an unset variable is an error)."""
    rendered = _render(contract.contract.intent, contract.param_values, environ, where="contract.intent")
    return rendered if isinstance(rendered, str) else _text_of(rendered)


def render_arguments(
    arguments: Mapping[str, Any], *, params: Mapping[str, Any], environ: Mapping[str, str]
) -> dict[str, Any]:
    """Step arguments with ``${params.X}``/``${env.X}`` filled in; ``${steps...}`` are left as they are.

    A string that is exactly one reference takes the referenced value with its JSON type; a
    reference inside longer text is written as text. Pure: nothing is read but the arguments.
    """

    def walk(value: Any, where: str) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, f"{where}.{k}") for k, v in cast(dict[str, Any], value).items()}
        if isinstance(value, list):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(cast(list[Any], value))]
        if isinstance(value, str) and "${" in value:
            return _render(value, params, environ, where=where)
        return value

    return {k: walk(v, f"arguments.{k}") for k, v in arguments.items()}


# -- params ---------------------------------------------------------------------------------------


def parse_param_args(args: Sequence[str], specs: Mapping[str, ParamSpec]) -> dict[str, ParamValue]:
    """``["k=v", ...]`` from the command line -> typed values by each param's declared type.

    Unknown names, a missing ``=``, a name given twice and text that is not of the declared type
    are ``UsageError``; range, length, regex and ``in`` checks happen when the contract loads.
    """
    out: dict[str, ParamValue] = {}
    for arg in args:
        name, sep, text = arg.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--param {arg!r} is not NAME=VALUE", remedy="Write --param name=value")
        spec = specs.get(name)
        if spec is None:
            declared = ", ".join(sorted(specs)) or "none"
            raise UsageError(
                f"--param {name}: the contract declares no such param",
                remedy=f"Use one of the declared params ({declared})",
                param=name,
            )
        if name in out:
            raise UsageError(f"--param {name} is given twice", remedy="Give each param once", param=name)
        out[name] = _coerce(name, text, spec)
    return out


def _coerce(name: str, text: str, spec: ParamSpec) -> ParamValue:
    if spec.type == "string":
        return text
    if spec.type == "boolean":
        lowered = text.strip().lower()
        if lowered in ("true", "yes", "1", "on"):
            return True
        if lowered in ("false", "no", "0", "off"):
            return False
        raise UsageError(f"--param {name}={text!r}: expected true or false", remedy="Write true or false", param=name)
    try:
        if spec.type == "integer":
            if not re.fullmatch(r"[+-]?\d{1,16}", text.strip()):
                raise ValueError(text)
            return int(text)  # range checks, 2**53 included, happen in ParamSpec.problem_with
        number = float(text)
        if not math.isfinite(number):
            raise ValueError(text)
        return int(number) if number.is_integer() and re.fullmatch(r"[+-]?\d+", text.strip()) else number
    except ValueError:
        raise UsageError(
            f"--param {name}={text!r}: expected {'an integer' if spec.type == 'integer' else 'a number'}",
            remedy="Write a plain decimal number",
            param=name,
        ) from None


def _param_values(contract: Contract, layer: _Layer, given: Mapping[str, Any]) -> dict[str, ParamValue]:
    specs = contract.contract.params
    out: dict[str, ParamValue] = {}
    for name, value in given.items():
        spec = specs.get(name)
        if spec is None:
            declared = ", ".join(sorted(specs)) or "none"
            raise layer.error(
                f"the caller passed param {name!r}, which the contract does not declare",
                ("contract", "params"),
                remedy=f"Pass only declared params ({declared})",
                param=name,
            )
        problem = spec.problem_with(value)
        if problem:
            raise layer.error(
                f"param {name!r}: {problem}", ("contract", "params", name), remedy="Pass a value that fits", param=name
            )
        out[name] = cast(ParamValue, value)
    for name, spec in specs.items():
        if name not in out:
            if spec.default is None:
                raise layer.error(
                    f"param {name!r} is required and was not given",
                    ("contract", "params", name),
                    remedy=f"Pass --param {name}=VALUE (or give it a default)",
                    param=name,
                )
            out[name] = spec.default
    return dict(sorted(out.items()))


# -- harness limits -------------------------------------------------------------------------------


def _check_harness(contract: Contract, layers: list[_Layer], effective: dict[str, Any]) -> None:
    harness = contract.harness
    for i, server in enumerate(contract.mcp.servers):
        if (
            server.transport == "stdio"
            and harness.allow_commands is not None
            and server.command not in harness.allow_commands
        ):
            raise _error_in(
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
                raise _error_in(
                    layers,
                    effective,
                    ("mcp", "servers", i, "url"),
                    f"server {server.name!r}: host {host!r} is not in the operator's [harness] allow_hosts",
                    remedy="Use an allowed host, or ask the operator to add it to allow_hosts",
                    server=server.name,
                )


# -- the entry points -----------------------------------------------------------------------------


def load_contract(
    path: Path | str,
    *,
    home: Path | str | None = None,
    agent_file: Path | str | None = None,
    overlay: Path | str | None = None,
    params: Mapping[str, Any] | None = None,
    param_args: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Contract:
    """The effective contract of the file at ``path`` with its layers (see the module docstring).

    ``home``: the Truss home whose ``config.toml`` (if present) is the operator layer.
    ``params``: typed values from a caller (serve-mcp); ``param_args``: ``["k=v"]`` from the
    command line, typed by the contract's specs. ``environ``: when given, every ``${env.X}`` the
    contract uses must be set in it (values are not read into the contract).
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
) -> Contract:
    """``load_contract`` over texts: each layer is ``(file name for messages, TOML text)``. No I/O."""
    contract_layer = _parse(text, file=source, role="contract")
    config_layer = _parse(config[1], file=config[0], role="operator config") if config else None
    agent_layer = _parse(agent[1], file=agent[0], role="agent") if agent else None
    overlay_layer = _parse(overlay[1], file=overlay[0], role="overlay") if overlay else None
    layers = [x for x in (config_layer, agent_layer, contract_layer, overlay_layer) if x is not None]

    effective = _merge_layers(config_layer, agent_layer, contract_layer, overlay_layer)
    try:
        contract = Contract.model_validate(effective)
    except ValidationError as exc:
        raise _from_validation(exc, layers, effective) from None
    _check_templates(layers, effective, contract.contract.params)
    _check_harness(contract, layers, effective)

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
    contract = contract.model_copy(update={"param_values": _param_values(contract, contract_layer, given)})

    if environ is not None:
        for name in _env_refs(contract):
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


def narrow_budget(contract: Contract, overrides: Mapping[str, Any]) -> Contract:
    """The contract with some ``[budget]`` limits lowered (serve-mcp callers may only narrow).

    Every key must be a limit of ``[budget]`` and its value may only be at or below the
    contract's; raising a limit, an unknown key or a bad value is an ``InputError``.
    """
    current = contract.budget
    narrowable = {"max_tool_calls", "max_model_turns", "max_tokens", "deadline", "call_timeout", "max_result_bytes"}
    update: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in narrowable:
            raise InputError(
                f"budget key {key!r} cannot be set by a caller",
                remedy=f"Use only {', '.join(sorted(narrowable))}",
                key=key,
            )
        before: Any = getattr(current, key)
        if key in ("deadline", "call_timeout"):
            if not isinstance(value, str):
                raise InputError(f"budget {key} must be a duration string such as '30s'", key=key)
            try:
                lower = parse_duration_ms(value) <= parse_duration_ms(before)
            except ValueError as exc:
                raise InputError(f"budget {key}: {exc}", key=key) from None
        else:
            if not isinstance(value, int) or isinstance(value, bool) or value < (0 if key == "max_tool_calls" else 1):
                raise InputError(f"budget {key} must be a positive whole number", key=key)
            lower = before is None or value <= before
        if not lower:
            raise InputError(
                f"budget {key} may only be lowered: the contract allows {before}, the caller asked for {value}",
                remedy="Ask for a limit at or below the contract's",
                key=key,
                limit=before,
                requested=value,
            )
        update[key] = value
    budget = Budget.model_validate({**current.model_dump(by_alias=True), **update})
    return contract.model_copy(update={"budget": budget})


# -- where keys are in the source text --------------------------------------------------------------

_BARE_KEY = r"[A-Za-z0-9_-]+"
_KEY_PART = rf"(?:{_BARE_KEY}|\"(?:[^\"\\]|\\.)*\"|'[^']*')"
_DOTTED_KEY = re.compile(rf"\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*")


def _split_key(text: str) -> list[str]:
    parts: list[str] = []
    for match in re.finditer(_KEY_PART, text):
        part = match.group(0)
        if part.startswith('"'):
            try:  # let tomllib decode the escapes, exactly as it did for the data
                part = next(iter(tomllib.loads(f"{part} = 0")))
            except tomllib.TOMLDecodeError:
                part = part[1:-1]
        elif part.startswith("'"):
            part = part[1:-1]
        parts.append(part)
    return parts


def _key_lines(text: str) -> dict[KeyPath, tuple[int, int]]:
    """Map each table header and ``key =`` line to its (line, column), with array-of-table indices.

    A light scanner, not a parser: it runs only on text ``tomllib`` has accepted, tracks multi-line
    strings and arrays so their insides are not taken for keys, and leaves keys inside inline
    tables to the line of the key that holds them.
    """
    out: dict[KeyPath, tuple[int, int]] = {}
    counts: dict[KeyPath, int] = {}
    table: KeyPath = ()
    depth = 0
    in_string: str | None = None
    for number, line in enumerate(text.split("\n"), start=1):
        start = 0
        if in_string is None and depth == 0:
            stripped = line.lstrip()
            indent = len(line) - len(stripped)
            header = re.match(rf"(\[\[?)\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*\]\]?", stripped)
            if header is not None:
                parts = _split_key(header.group(2))
                resolved: list[str | int] = []
                for part in parts[:-1]:
                    resolved.append(part)
                    index = counts.get(tuple(resolved))
                    if index is not None:
                        resolved.append(index)
                resolved.append(parts[-1])
                if header.group(1) == "[[":
                    array = tuple(resolved)
                    counts[array] = counts.get(array, -1) + 1
                    out.setdefault(array, (number, indent + 1))
                    resolved.append(counts[array])
                out.setdefault(tuple(resolved), (number, indent + 1))
                table = tuple(resolved)
                continue
            key = _DOTTED_KEY.match(line)
            if key is not None and line[key.end() : key.end() + 1] == "=" and not stripped.startswith("#"):
                out.setdefault((*table, *_split_key(key.group(1))), (number, indent + 1))
                start = key.end() + 1
        depth, in_string = _scan_value(line, start, depth, in_string)
    return out


def _scan_value(line: str, i: int, depth: int, in_string: str | None) -> tuple[int, str | None]:
    """Advance bracket depth and multi-line string state over one line of a value."""
    n = len(line)
    while i < n:
        if in_string is not None:
            if in_string in ('"""', "'''"):
                end = line.find(in_string, i)
                if end < 0:
                    return depth, in_string
                i = end + 3
                in_string = None
                continue
            ch = line[i]
            if ch == "\\" and in_string == '"':
                i += 2
                continue
            if ch == in_string:
                in_string = None
            i += 1
            continue
        ch = line[i]
        if ch == "#":
            break
        if line.startswith('"""', i) or line.startswith("'''", i):
            in_string = line[i : i + 3]
            i += 3
            continue
        if ch in "\"'":
            in_string = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth = max(0, depth - 1)
        i += 1
    if in_string in ('"', "'"):
        in_string = None  # single-line strings cannot span lines
    return depth, in_string
