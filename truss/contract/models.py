"""The contract models: every table and key of a contract except ``[[mcp.servers]]`` and ``[[done.checks]]``.

``Contract`` is the effective contract (DESIGN section 2): what the loader builds from the layers,
what is hashed and recorded when a session starts, and what every later stage reads. The models
refuse unknown keys at every level and check names, globs, regexes, durations and sizes; a
provider name must be registered (``truss.contract.providers``) and a done-check kind too
(``truss.contract.checks``): the registries come from the validation context, or are the
defaults. Servers live in ``truss.contract.servers``. Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from truss._regex import regex_profile
from truss.contract.checks import DoneCheck
from truss.contract.fields import (
    NAME_RE,
    BaseUrl,
    Duration,
    EnvName,
    Glob,
    KeyValueError,
    Model,
    NonNegativeInt,
    PositiveInt,
    Regex,
    check_tool_ref,
    toml_type,
)
from truss.contract.hashing import contract_hash
from truss.contract.providers import provider_kinds_in
from truss.contract.sandbox import Sandbox, SandboxLevel
from truss.contract.servers import McpConfig
from truss.ledger.canonical import number_problem

__all__ = [
    "AgentConfig",
    "ArgCondition",
    "Budget",
    "Contract",
    "ContractMeta",
    "DoneConfig",
    "Harness",
    "LedgerSettings",
    "ParamSpec",
    "Policy",
    "PolicyRule",
    "Quota",
    "Step",
]


# -- [contract] -------------------------------------------------------------------------------


class ParamSpec(Model):
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
            return f"expected {article} {kind}, got {toml_type(value)}"
        if (problem := number_problem(value)) is not None:
            return problem
        if isinstance(value, str):
            if any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
                return "holds a lone surrogate, which is not text"
            if self.max_len is not None and len(value) > self.max_len:
                return f"longer than max_len {self.max_len}"
            if self.regex is not None:
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


class ContractMeta(Model):
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
            if not re.match(r"^[a-z_][a-z0-9_]{0,63}\Z", key):
                raise ValueError(f"param name {key!r} must be [a-z_][a-z0-9_]*")
        return value


# -- [agent] ----------------------------------------------------------------------------------


class Step(Model):
    """One planned call of the scripted provider."""

    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict[str, Any])

    @field_validator("tool")
    @classmethod
    def _tool(cls, value: str) -> str:
        return check_tool_ref(value)


class AgentConfig(Model):
    provider: str = "scripted"
    model: str | None = None
    base_url: BaseUrl | None = None
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

    @field_validator("provider")
    @classmethod
    def _registered(cls, value: str, info: ValidationInfo) -> str:
        kinds = provider_kinds_in(info.context)
        if value not in kinds:
            raise KeyValueError(
                kinds.unknown(value),
                remedy="Use a provider docs/providers.md lists, or register yours in truss.providers.PROVIDERS",
            )
        return value

    @model_validator(mode="after")
    def _provider_needs(self, info: ValidationInfo) -> AgentConfig:
        kind = provider_kinds_in(info.context).get(self.provider)  # None only if _registered refused it
        if kind is not None and kind.capabilities.needs_model and not self.model:
            raise ValueError(f"provider {self.provider!r} needs a model (agent.model)")
        return self


# -- [budget] ---------------------------------------------------------------------------------


class Budget(Model):
    max_tool_calls: NonNegativeInt = 100
    max_model_turns: PositiveInt = 20
    max_tokens: PositiveInt | None = None
    deadline: Duration = "10m"
    call_timeout: Duration = "60s"
    max_result_bytes: PositiveInt = 1_048_576
    charge_memo_hits: bool = True


# -- [policy] ---------------------------------------------------------------------------------


class ArgCondition(Model):
    """Conditions on one argument; all given must hold for the rule to match.

    ``glob``, ``not_glob``, ``regex`` and ``under`` are the path operators: ``truss.policy`` matches
    them against the normalised string and never vouches for one with a ``..`` segment. ``each``
    holds conditions every element of an array argument must pass.
    """

    equals: Any = None
    in_: list[Any] | None = Field(default=None, alias="in")
    glob: Glob | None = None
    not_glob: Glob | None = None
    regex: Regex | None = None
    under: str | None = None
    max_len: NonNegativeInt | None = None
    min: int | float | None = None
    max: int | float | None = None
    each: ArgCondition | None = None

    @field_validator("under")
    @classmethod
    def _directory(cls, value: str | None) -> str | None:
        if value is None:
            return None
        segments = value.split("/")
        if not value.startswith("/") or "\\" in value or "\x00" in value:
            raise ValueError(f"under {value!r} must be an absolute directory path ('/srv/work')")
        if any(s in (".", "..") for s in segments) or "//" in value:
            raise ValueError(f"under {value!r} must be a normalised path: no '.', '..' or empty segments")
        return value

    @model_validator(mode="after")
    def _not_empty(self) -> ArgCondition:
        if not self.model_fields_set:
            raise ValueError(
                "an argument condition needs at least one of equals, in, glob, not_glob, regex, under, max_len, "
                "min, max, each"
            )
        # Conditions no value can meet: the rule never matches, so a deny meant as a guard guards nothing.
        if self.min is not None and self.max is not None and self.min > self.max:
            raise KeyValueError(
                f"min {self.min} is greater than max {self.max}, so no value meets this condition and the rule "
                "never applies",
                remedy="Swap min and max (both bounds are inclusive), or remove one",
                at=("min",),
            )
        if self.in_ is not None and not self.in_:
            raise KeyValueError(
                "in is an empty list, so no value is in it and the rule never applies",
                remedy="List the allowed values, or remove in",
                at=("in",),
            )
        return self


class PolicyRule(Model):
    tool: Glob
    effect: Literal["allow", "deny", "ask"]
    reason: str | None = None
    args: dict[str, ArgCondition] = Field(default_factory=dict[str, ArgCondition])


class Policy(Model):
    default: Literal["allow", "deny"] = "allow"
    readonly_only: bool = False
    rules: list[PolicyRule] = Field(default_factory=list[PolicyRule])


# -- [[done.checks]] --------------------------------------------------------------------------


class DoneConfig(Model):
    checks: list[DoneCheck] = Field(default_factory=list[DoneCheck])
    # Without checks a run passes only when a call succeeded and none was denied (truss.verdict),
    # unless the contract opts out. None (not set) is left out of the hashed form.
    pass_without_checks: bool | None = None

    @model_validator(mode="after")
    def _opt_out_without_checks(self) -> DoneConfig:
        if self.pass_without_checks and self.checks:
            raise KeyValueError(
                "pass_without_checks applies only to a contract without done checks",
                remedy="Remove pass_without_checks, or the [[done.checks]]",
                at=("pass_without_checks",),
            )
        return self


# -- [[quotas]] and [[harness.quotas]] ----------------------------------------------------------


class Quota(Model):
    """A limit across runs over a sliding ``window`` (``truss.quota``; docs/contracts.md "Quotas").

    ``per`` says what is counted together: every run of the contract (``contract``), of one
    principal (``principal``), the calls to one server (``server``: the named one, or each server
    the run declares) or to one tool (``tool``, named as ``mcp:<server>:<tool>``). An operator
    quota (``[[harness.quotas]]``) counts across every contract; a contract's own (``[[quotas]]``)
    counts only that contract's runs and can only add limits, never lift the operator's.
    """

    name: str | None = None
    window: Duration
    per: Literal["contract", "principal", "server", "tool"] = "contract"
    server: str | None = None
    tool: str | None = None
    runs: NonNegativeInt | None = None
    tool_calls: NonNegativeInt | None = None
    tokens: NonNegativeInt | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not NAME_RE.match(value):
            raise ValueError(f"quota name {value!r} must be 1-64 of [a-z0-9-], starting with a letter or digit")
        return value

    @field_validator("tool")
    @classmethod
    def _tool(cls, value: str | None) -> str | None:
        return None if value is None else check_tool_ref(value)

    @model_validator(mode="after")
    def _shape(self) -> Quota:
        if self.runs is None and self.tool_calls is None and self.tokens is None:
            raise ValueError("a quota needs at least one of runs, tool_calls, tokens")
        if self.tool is not None and self.per != "tool":
            raise ValueError('tool is only for per = "tool"')
        if self.per == "tool" and self.tool is None:
            raise ValueError('per = "tool" needs tool = "mcp:<server>:<tool>"')
        if self.server is not None and self.per != "server":
            raise ValueError('server is only for per = "server"')
        if self.per in ("server", "tool") and self.tokens is not None:
            raise ValueError(f"tokens cannot be counted per {self.per}: a model turn belongs to no one server or tool")
        return self


# -- [ledger], [harness] ----------------------------------------------------------------------


class LedgerSettings(Model):
    durability: Literal["power", "process"] = "power"


class Harness(Model):
    """Operator-only settings ($TRUSS_HOME/config.toml): which commands and hosts servers may use, and
    how stdio servers are confined (``sandbox``: the level; ``sandbox_profile``: the baseline every
    confined server's profile is layered over, ``truss.contract.sandbox``)."""

    allow_commands: list[str] | None = None
    allow_hosts: list[str] | None = None
    sandbox: SandboxLevel | None = None
    sandbox_profile: Sandbox | None = None
    quotas: list[Quota] | None = None
    keep: Literal["forever"] | Duration | None = None

    @field_validator("sandbox_profile")
    @classmethod
    def _baseline(cls, value: Sandbox | None) -> Sandbox | None:
        if value is not None and value.enabled is not None:
            raise KeyValueError(
                "the operator's baseline cannot set enabled; the level says which servers are confined",
                remedy='Remove enabled; set [harness] sandbox = "off", "required" or "enforced"',
            )
        return value


# -- the whole ----------------------------------------------------------------------------------


class Contract(Model):
    contract: ContractMeta
    agent: AgentConfig = Field(default_factory=AgentConfig)
    budget: Budget = Field(default_factory=Budget)
    policy: Policy = Field(default_factory=Policy)
    mcp: McpConfig = Field(default_factory=McpConfig)
    done: DoneConfig = Field(default_factory=DoneConfig)
    ledger: LedgerSettings = Field(default_factory=LedgerSettings)
    harness: Harness = Field(default_factory=Harness)
    quotas: list[Quota] | None = None
    param_values: dict[str, str | int | float | bool] = Field(default_factory=dict[str, str | int | float | bool])

    def to_json(self) -> dict[str, Any]:
        """The JSON form whose canonical bytes are hashed (aliases, no None-valued keys)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    @property
    def hash(self) -> str:
        """``sha256:`` over the RFC 8785 bytes of ``to_json()`` (see ``truss.contract.hashing``)."""
        return contract_hash(self)
