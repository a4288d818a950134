"""Confining stdio MCP servers with bubblewrap: the profile, the plan, the egress proxy, limits.

Sans-IO parts (unit-tested without starting anything): ``parse_table``/``parse_operator`` and
``merge_profiles`` (the profile and its layering, in the leaf ``truss._sandbox_profile``, which the
contract package shares), ``resolve_command`` (what a command needs to
start, over an injected ``FsView``), ``plan_sandbox`` (the bwrap options and the recorded
description). Edges: ``find_bwrap``, the cgroups, ``EgressProxy``, the entry point
``confined`` and ``SandboxLauncher``, the MCP tier's launcher that confines each stdio server its
contract confines. docs/sandbox.md describes the profile keys, the network modes, the limits and what
is not protected.

This package does not write the ledger: the session records the launcher's description and the
``sandbox_egress`` events it reports.
"""

from __future__ import annotations

from truss._sandbox_profile import (
    HostRule,
    Limits,
    NetworkMode,
    OperatorSandbox,
    Profile,
    SandboxTable,
    match_host,
    merge_profiles,
    parse_host_rule,
    parse_operator,
    parse_size,
    parse_table,
)
from truss.mcp.sandbox._argv import PROXY_SOCKET, RELAY_PORT, SandboxPlan, plan_sandbox
from truss.mcp.sandbox._bwrap import Bwrap, find_bwrap
from truss.mcp.sandbox._cgroup import LimitHit
from truss.mcp.sandbox._confine import Spawn, confined, plan_for
from truss.mcp.sandbox._fs import OsFs
from truss.mcp.sandbox._launcher import SandboxLauncher, egress_record, profile_of
from truss.mcp.sandbox._proxy import MAX_EGRESS_EVENTS, EgressEvent, EgressProxy, EgressSummary, SandboxEvent
from truss.mcp.sandbox._resolve import Bind, FsView, Resolution, SystemLayout, resolve_command, system_layout

__all__ = [
    "MAX_EGRESS_EVENTS",
    "PROXY_SOCKET",
    "RELAY_PORT",
    "Bind",
    "Bwrap",
    "EgressEvent",
    "EgressProxy",
    "EgressSummary",
    "FsView",
    "HostRule",
    "LimitHit",
    "Limits",
    "NetworkMode",
    "OperatorSandbox",
    "OsFs",
    "Profile",
    "Resolution",
    "SandboxEvent",
    "SandboxLauncher",
    "SandboxPlan",
    "SandboxTable",
    "Spawn",
    "SystemLayout",
    "confined",
    "egress_record",
    "find_bwrap",
    "match_host",
    "merge_profiles",
    "parse_host_rule",
    "parse_operator",
    "parse_size",
    "parse_table",
    "plan_for",
    "plan_sandbox",
    "profile_of",
    "resolve_command",
    "system_layout",
]
