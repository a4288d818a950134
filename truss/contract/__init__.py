"""Contracts: the models of every table and key, and loading, layering, substitution and hashing.

A contract is one TOML file (DESIGN section 2). The package has one module per job:

- ``fields``: the value types of keys (names, globs, regexes, durations, pointers) and the model base;
- ``models``: the tables (``Contract`` and everything in it but servers and done checks);
- ``servers``: ``[[mcp.servers]]``;
- ``sandbox``: ``[mcp.servers.sandbox]``, the operator's sandbox level and baseline, and each stdio
  server's effective sandbox;
- ``checks``: ``[[done.checks]]`` and the registry of done-check kinds with their evaluations;
- ``reviewers`` and ``panel``: the ``panel`` kind's reviewers and its (pure) evaluation;
- ``providers``: the registry of provider kinds ``[agent] provider`` may name, and their capabilities;
- ``layers``: reading files and merging operator config, agent file, contract and overlay;
- ``validation``: pydantic's errors as one located ``ContractError``;
- ``locating``: key paths and where each key is in a file's text;
- ``substitution``: ``${params.X}``/``${env.X}``/``${steps...}``, checked at load, rendered at run time;
- ``params``: typed param values and narrowed budgets from callers;
- ``hashing``: the contract hash;
- ``telemetry``: the operator's ``[telemetry]`` table (never part of the effective contract);
- ``harness``: the operator's ``[harness]`` table read without a contract (retention, quotas);
- ``loading``: ``load_contract``, which ties them together.

Every name below is importable from ``truss.contract`` itself. Reading files is the only I/O.
"""

from __future__ import annotations

from truss.contract.checks import (
    DONE_CHECKS,
    CallRecord,
    Checked,
    CheckFold,
    CheckKind,
    DoneCheck,
    Evidence,
    match_value,
    value_at,
)
from truss.contract.fields import duration_ms
from truss.contract.harness import harness_from_text, keep_ms, load_operator_harness
from truss.contract.hashing import contract_hash
from truss.contract.layers import MAX_FILE_BYTES, MAX_NESTING, decode_toml_bytes, read_toml_file
from truss.contract.loading import load_contract, load_contract_text, validation_context
from truss.contract.locating import format_path
from truss.contract.models import (
    AgentConfig,
    ArgCondition,
    Budget,
    Contract,
    ContractMeta,
    DoneConfig,
    Harness,
    LedgerSettings,
    ParamSpec,
    Policy,
    PolicyRule,
    Quota,
    Step,
)
from truss.contract.panel import PANEL, PANEL_KIND, panel_checks, reviewer_name, uses_panel
from truss.contract.params import narrow_budget, parse_param_args
from truss.contract.providers import PROVIDER_KINDS, ProviderCapabilities, ProviderKind
from truss.contract.reviewers import Reviewer
from truss.contract.sandbox import SANDBOX_LEVELS, Sandbox, SandboxLevel, SandboxLimits, effective_sandbox
from truss.contract.servers import (
    AsyncDecl,
    AsyncPending,
    Elicitation,
    ElicitValue,
    McpConfig,
    OAuth,
    SecretHeader,
    Server,
    ToolSettings,
)
from truss.contract.substitution import render_arguments, render_intent, template_refs
from truss.contract.telemetry import Telemetry, load_telemetry_config, telemetry_from_text

__all__ = [
    "DONE_CHECKS",
    "MAX_FILE_BYTES",
    "MAX_NESTING",
    "PANEL",
    "PANEL_KIND",
    "PROVIDER_KINDS",
    "SANDBOX_LEVELS",
    "AgentConfig",
    "ArgCondition",
    "AsyncDecl",
    "AsyncPending",
    "Budget",
    "CallRecord",
    "CheckFold",
    "CheckKind",
    "Checked",
    "Contract",
    "ContractMeta",
    "DoneCheck",
    "DoneConfig",
    "ElicitValue",
    "Elicitation",
    "Evidence",
    "Harness",
    "LedgerSettings",
    "McpConfig",
    "OAuth",
    "ParamSpec",
    "Policy",
    "PolicyRule",
    "ProviderCapabilities",
    "ProviderKind",
    "Quota",
    "Reviewer",
    "Sandbox",
    "SandboxLevel",
    "SandboxLimits",
    "SecretHeader",
    "Server",
    "Step",
    "Telemetry",
    "ToolSettings",
    "contract_hash",
    "decode_toml_bytes",
    "duration_ms",
    "effective_sandbox",
    "format_path",
    "harness_from_text",
    "keep_ms",
    "load_contract",
    "load_contract_text",
    "load_operator_harness",
    "load_telemetry_config",
    "match_value",
    "narrow_budget",
    "panel_checks",
    "parse_param_args",
    "read_toml_file",
    "render_arguments",
    "render_intent",
    "reviewer_name",
    "telemetry_from_text",
    "template_refs",
    "uses_panel",
    "validation_context",
    "value_at",
]
